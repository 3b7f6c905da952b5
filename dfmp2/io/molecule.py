"""The molecule: element data, effective core potentials, geometry checks and PySCF's Mole.

What every SCF engine and the MP2 stage read from the input: ``build_molecule`` turns a
Geometry (Ångström) into PySCF's ``gto.Mole`` (orbital basis, ECPs where the basis has them,
ghost atoms as 'GHOST-<El>', charge and multiplicity checked against the electron count);
``check_geometry`` refuses atoms closer than MIN_ATOM_DISTANCE Å; ``ecp_*`` say which elements
carry an ECP and how many core electrons it replaces; ``linear_dependence`` and
``overlap_cutoff`` the orbitals PySCF's canonical orthogonalisation keeps (nmo <= nbasis);
``frozen_core_count`` the chemical frozen core; ``element`` and ``orbital_basis_names`` the
element and orbital basis name of each atom (the fitting sets, dfmp2.df.basis, are keyed by them).
"""

from __future__ import annotations

import warnings

import numpy as np
from pyscf import gto
from pyscf.data.elements import CONFIGURATION, ELEMENTS, _atom_symbol, _rm_digit, _std_symbol_without_ghost, chemcore
from pyscf.gto.basis import _format_basis_name
from pyscf.lib.exceptions import BasisNotFoundError
from pyscf.scf import hf as pyscf_hf

from dfmp2.errors import InputError, shown
from dfmp2.io.xyz import Geometry
from dfmp2.options import ECP_CHOICES, REFERENCES, basis_text

ELEMENTS_SET = frozenset(ELEMENTS[1:])
MIN_ATOM_DISTANCE = 0.1  # Ångström: closer atoms (ghosts included) are an input mistake

# Ghost atoms (counterpoise corrections, dfmp2.workflows.interaction): a Geometry atom with ghost=True
# becomes PySCF's 'GHOST-<El>' atom: no nuclear charge, no electrons, no frozen core
# (pyscf.data.elements.chemcore counts them as Z = 0), but the orbital basis and, through
# default_auxbasis (keyed by the real element), both fitting sets of its element. Everything
# that reads the Mole (hcore, energy_nuc, any SCF engine, the MP2 stage) sees them that way.
GHOST_PREFIX = "GHOST-"


def element(mol: gto.Mole, i: int) -> str:
    """The element of atom ``i`` whether it is a ghost or not ('GHOST-O' -> 'O')."""
    return _std_symbol_without_ghost(mol.atom_pure_symbol(i))


def _defines(name: str, element: str, load=gto.basis.load) -> bool:
    """Whether PySCF's ``load`` (the basis loader, or ``gto.basis.load_ecp``) finds something for
    ``element`` in ``name`` (a missing name or element: False)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bool(load(name, element))
    except (BasisNotFoundError, KeyError, RuntimeError, OSError, ValueError):
        return False


def _check_basis(name: str, elements, kind: str, option: str) -> None:
    """Raise InputError (about RunOptions field ``option``) if basis ``name`` lacks any of
    ``elements``."""
    missing = [el for el in sorted(set(elements)) if not _defines(name, el)]
    if missing:
        raise InputError(
            f"{kind} '{name}' is not defined for {', '.join(missing)}; choose another {kind}", option=option
        )


def ecp_core_electrons(basis, elements) -> dict:
    """{element: core electrons} for the elements of ``elements`` that basis ``basis`` comes with
    an effective core potential for, as PySCF's ECP loader finds them (def2-* beyond Kr, *-pp,
    LANL2DZ; {} for an all-electron basis or a basis given as a dict)."""
    if not isinstance(basis, str):
        return {}
    out = {}
    for el in sorted(set(elements)):
        if _defines(basis, el, gto.basis.load_ecp):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out[el] = int(gto.basis.load_ecp(basis, el)[0])
    return out


def ecp_not_attached(basis, elements) -> list[str]:
    """The elements of ``elements`` for which basis ``basis`` is made for an ECP (the Basis Set
    Exchange metadata PySCF ships) that PySCF's ECP loader does not find: with the BSE package
    installed PySCF's basis loader fills an element its file lacks from the BSE, the orbital basis
    without its ECP (def2-SVP on Ce-Lu), which run all-electron is meaningless."""
    meta = getattr(gto.mole, "BSE_META", {}).get(_format_basis_name(basis).lower()) if isinstance(basis, str) else None
    if not meta:
        return []
    return [
        el for el in sorted(set(elements)) if gto.charge(el) in meta[1] and not _defines(basis, el, gto.basis.load_ecp)
    ]


def ecp_info(mol: gto.Mole) -> dict | None:
    """The ECP a molecule carries, for the table and the JSON: {'name': the ECP's name,
    'elements': [El, ...], 'core_electrons': {El: n}} (electrons the ECP replaces, per atom of
    that element), or None for an all-electron molecule."""
    core = {}
    for i in range(mol.natm):
        n = int(mol.atom_nelec_core(i))
        if n:
            core[mol.atom_pure_symbol(i)] = n
    if not core:
        return None
    ecp = mol.ecp
    names = sorted({str(ecp[el]) for el in core if el in ecp}) if isinstance(ecp, dict) else [str(ecp)]
    return {"name": " + ".join(names), "elements": sorted(core), "core_electrons": core}


def describe_ecp(info: dict | None) -> str:
    """One line of ``ecp_info``: 'def2-svp for I (core electrons replaced: I 28)', or
    'none (all-electron)'."""
    if not info:
        return "none (all-electron)"
    cores = ", ".join(f"{el} {n}" for el, n in info["core_electrons"].items())
    return f"{info['name']} for {', '.join(info['elements'])} (core electrons replaced: {cores})"


def ecp_off_warning(basis, elements) -> str | None:
    """With ``ecp='none-for-testing'``: a warning when ``basis`` is made for an ECP on any of
    ``elements`` (run all-electron it lacks core functions, and the energies mean nothing)."""
    names = basis_names(basis, elements)
    with_ecp = {}
    for el, name in names.items():
        if name is not None:
            with_ecp.update(ecp_core_electrons(name, [el]))
    if not with_ecp:
        return None
    return (
        f"ECP off (ecp 'none-for-testing'): basis {basis_text(basis)} is made for an effective core potential "
        f"on {', '.join(with_ecp)}; run all-electron it lacks core functions and the energies "
        "are meaningless (keep the basis's ECP, ecp 'auto', or choose an all-electron basis)"
    )


def check_geometry(geom: Geometry) -> None:
    """Refuse atoms closer than MIN_ATOM_DISTANCE Å (coincident atoms make S and j2c singular)."""
    xyz = np.asarray(geom.coords_angstrom, dtype=np.float64).reshape(-1, 3)
    if not np.all(np.isfinite(xyz)):
        raise InputError(f"{geom.source or 'molecule'}: coordinates must be finite numbers")
    if len(xyz) < 2:
        return
    from scipy.spatial import cKDTree

    pairs = cKDTree(xyz).query_pairs(MIN_ATOM_DISTANCE, output_type="ndarray")
    if len(pairs):
        d = np.linalg.norm(xyz[pairs[:, 0]] - xyz[pairs[:, 1]], axis=1)
        k = int(np.lexsort((pairs[:, 1], pairs[:, 0], d))[0])
        i, j = sorted(int(x) for x in pairs[k])
        more = f" ({len(pairs) - 1} more such pairs)" if len(pairs) > 1 else ""

        def name(n):
            return f"ghost {geom.symbols[n]}" if geom.is_ghost(n) else geom.symbols[n]

        raise InputError(
            f"{geom.source or 'molecule'}: atoms {i + 1} ({name(i)}) and {j + 1} "
            f"({name(j)}) are {d[k]:.4f} Å apart, closer than {MIN_ATOM_DISTANCE} Å"
            f"{more}; check the coordinates (Ångström)"
        )


def minimal_basis_size(symbols) -> int:
    """Orbitals in the atoms' occupied ground-state shells (1s; 1s2s2p for C-Ne; ...): the size of
    a minimal basis. 2x this is the most electrons the atoms' occupied shells can hold."""
    n = 0
    for sym in symbols:
        for l, nel in enumerate(CONFIGURATION[gto.charge(sym)]):
            n += -(-nel // (2 * (2 * l + 1))) * (2 * l + 1)
    return n


def electron_count(geom: Geometry, charge: int | None = None, multiplicity: int | None = None):
    """(charge, multiplicity, electrons): options override the XYZ comment. Defaults: charge 0;
    multiplicity the lowest the electron count allows (1 for even, 2 for odd), as Psi4 takes it."""
    charge = charge if charge is not None else (geom.charge if geom.charge is not None else 0)
    nelec = sum(gto.charge(s) for s in geom.real_symbols) - charge  # ghosts have none
    mult = (
        multiplicity
        if multiplicity is not None
        else (geom.multiplicity if geom.multiplicity is not None else 1 + nelec % 2)
    )
    return charge, mult, nelec


def resolve_reference(
    reference: str, geom: Geometry, charge: int | None = None, multiplicity: int | None = None
) -> str:
    """'rhf' or 'uhf' for the ``reference`` option (auto: RHF for a closed shell, UHF otherwise). ROHF is
    refused, and so is RHF for an open shell (InputError, before any integral)."""
    if reference not in REFERENCES:
        raise InputError(f"unknown reference '{reference}'; use one of {', '.join(REFERENCES)}", option="reference")
    if reference == "rohf":
        raise InputError(
            "ROHF references are not supported (ROHF-MP2 needs semicanonical orbitals "
            "and a singles term); use a UHF reference (the default for open shells)",
            option="reference",
        )
    _, mult, nelec = electron_count(geom, charge, multiplicity)
    open_shell = mult != 1 or nelec % 2 == 1
    if reference == "rhf" and open_shell:
        raise InputError(
            f"{geom.source or 'molecule'}: RHF needs a closed shell, but {nelec} electrons "
            f"with multiplicity {mult} is open-shell; use a UHF reference (uhf or auto)",
            option="reference",
        )
    if reference == "auto":
        return "uhf" if open_shell else "rhf"
    return reference


def basis_names(basis, elements) -> dict:
    """{element: its orbital basis name, or None where it is given as shells} of the basis option
    (one name, or RunOptions' per-element dict: the element's key, else 'default'). InputError
    (option basis) for a key that is not an element symbol or 'default', or an element of
    ``elements`` that the dict does not cover."""
    from dfmp2.options import BASIS_DEFAULT_KEY

    els = list(dict.fromkeys(elements))
    if isinstance(basis, str):
        return dict.fromkeys(els, basis)
    unknown = [k for k in basis if k != BASIS_DEFAULT_KEY and k not in ELEMENTS_SET]
    if unknown:
        raise InputError(
            f"option basis: {', '.join(map(repr, unknown))} is not an element symbol (a per-element basis "
            f"is keyed by element, with '{BASIS_DEFAULT_KEY}' for the rest)",
            option="basis",
        )
    missing = [el for el in els if el not in basis and BASIS_DEFAULT_KEY not in basis]
    if missing:
        raise InputError(
            f"the per-element basis {basis_text(basis)} has no entry for {', '.join(missing)}; give one "
            f"(or '{BASIS_DEFAULT_KEY}:name' for every element not named)",
            option="basis",
        )
    out = {}
    for el in els:
        v = basis.get(el, basis.get(BASIS_DEFAULT_KEY))
        out[el] = v if isinstance(v, str) else None
    return out


def _ecp_cores(where: str, names: dict, real, ecp: str) -> dict:
    """{element: core electrons} of the ECPs ``build_molecule`` attaches for ``ecp`` ('auto': the
    basis's own, per element (``names``: basis_names); else none); InputError for a basis made
    for an ECP that PySCF does not attach, or one made for an ECP run all-electron with ecp 'none'."""
    ecp_core, lost = {}, []
    for el in dict.fromkeys(real):
        if names.get(el) is None:
            continue  # shells: no ECP
        ecp_core.update(ecp_core_electrons(names[el], [el]))
        if ecp != "none-for-testing":
            lost += ecp_not_attached(names[el], [el])
    basis = " + ".join(sorted({names[el] for el in [*lost, *ecp_core]}))
    if lost:
        raise InputError(
            f"{where}: basis {basis} for {', '.join(lost)} is made for an effective core "
            "potential that PySCF does not attach (its orbital basis alone would come from the "
            "Basis Set Exchange); choose another basis",
            option="basis",
        )
    if ecp == "none" and ecp_core:
        raise InputError(
            f"{where}: basis {basis} is made for an effective core potential on "
            f"{', '.join(ecp_core)}; all-electron it lacks core functions and its energies are "
            "meaningless; keep its ECP (auto), choose an all-electron basis, or, to run it "
            "anyway for a test, ecp 'none-for-testing'",
            option="ecp",
        )
    return ecp_core if ecp == "auto" else {}


def build_molecule(
    geom: Geometry,
    basis: str = "cc-pvdz",
    charge: int | None = None,
    multiplicity: int | None = None,
    ecp: str = "auto",
) -> gto.Mole:
    """PySCF molecule (``mol.spin`` = multiplicity - 1). Options override the XYZ comment;
    default charge 0, multiplicity the lowest for the electron count (``electron_count``).
    Ghost atoms (``geom.ghost``) carry the basis of their element and nothing else; the electron
    counts below are over the real atoms.

    ``ecp``: 'auto' attaches the effective core potential that basis ``basis`` comes with, for
    the elements PySCF's ECP loader finds one for (def2-* beyond Kr, *-pp, LANL2DZ), as ORCA and
    Psi4 do; 'none' runs all-electron, and is refused for a basis made for an ECP (its energies
    are meaningless: HI/def2-SVP gives E(HF) -1996.9 Eh against about -7117 all-electron);
    'none-for-testing' runs such a basis all-electron all the same (the caller warns:
    ``ecp_off_warning``). Electron counts below are of the electrons left outside the ECP cores.

    Refuses (InputError, before any integral) a multiplicity that is not a positive integer or is
    impossible for the electron count (parity: an even count has an odd multiplicity and an odd
    count an even one; more unpaired electrons than electrons), no electrons, more electrons than
    the atoms' occupied shells can hold (2 x ``minimal_basis_size``: the rest would sit in
    diffuse/Rydberg functions and the SCF energy is meaningless), no virtual orbital (n_alpha >=
    nbasis), and atoms closer than MIN_ATOM_DISTANCE Å.
    """
    charge, mult, nelec = electron_count(geom, charge, multiplicity)
    where = geom.source or "molecule"
    check_geometry(geom)
    if ecp not in ECP_CHOICES:
        raise InputError(f"unknown ECP setting '{ecp}'; use one of {', '.join(ECP_CHOICES)}", option="ecp")
    if mult < 1:
        raise InputError(
            f"{where}: multiplicity {mult} is not valid (it is 2S+1, a positive "
            "integer; 1 for a closed shell, 2 for a doublet, 3 for a triplet)",
            option="multiplicity",
        )
    names = basis_names(basis, geom.symbols)
    for el, name in names.items():
        if name is not None:
            _check_basis(name, [el], "basis", "basis")
    real = geom.real_symbols  # ghosts carry neither electrons nor an ECP
    if not real:
        raise InputError(f"{where}: every atom is a ghost; at least one real atom is needed")
    ecp_core = _ecp_cores(where, names, real, ecp)
    n_ecp = sum(ecp_core.get(s, 0) for s in real)  # even per atom: parity and multiplicity unchanged
    nelec -= n_ecp
    unpaired = mult - 1
    _check_electron_count(where, charge, mult, nelec, n_ecp, real)
    mol = _pyscf_mole(geom, basis, {el: names[el] for el in ecp_core}, charge, unpaired)
    if (nelec + unpaired) // 2 >= mol.nao_nr():
        raise InputError(
            f"{where}: {nelec} electrons fill all {mol.nao_nr()} functions of basis "
            f"'{basis_text(basis)}': no virtual orbitals for MP2; use a larger basis",
            option="basis",
        )
    return mol


def _check_electron_count(where: str, charge: int, mult: int, nelec: int, n_ecp: int, real) -> None:
    """InputError unless ``nelec`` electrons (those outside the ECP cores, ``n_ecp`` of them
    inside) can carry multiplicity ``mult`` and fit the occupied shells of the atoms ``real``."""
    outside = f" outside the ECP cores ({n_ecp} electrons)" if n_ecp else ""
    if nelec <= 0:
        raise InputError(
            f"{where}: charge {charge:+d} leaves {nelec} electrons{outside}; check the charge", option="charge"
        )
    unpaired = mult - 1
    if unpaired > nelec:
        raise InputError(
            f"{where}: multiplicity {mult} needs {unpaired} unpaired electrons but the "
            f"molecule has only {nelec}{outside}; check the charge and multiplicity",
            option=("charge", "multiplicity"),
        )
    if (nelec - unpaired) % 2:
        raise InputError(
            f"{where}: {nelec} electrons cannot have multiplicity {mult}: an "
            f"{'even' if nelec % 2 == 0 else 'odd'} electron count needs an "
            f"{'odd' if nelec % 2 == 0 else 'even'} multiplicity (2S+1); check the "
            "charge and multiplicity",
            option=("charge", "multiplicity"),
        )
    capacity = 2 * minimal_basis_size(real) - n_ecp  # ECP cores are filled shells
    if nelec > capacity:
        raise InputError(
            f"{where}: charge {charge:+d} gives {nelec} electrons{outside}, more than the "
            f"{capacity} that the atoms' occupied shells hold; check the charge",
            option="charge",
        )


def _pyscf_mole(geom: Geometry, basis, ecps: dict, charge: int, spin: int) -> gto.Mole:
    """The built PySCF Mole in Angstrom, ghosts under GHOST_PREFIX, ``ecps`` {element: ECP name}.
    InputError (option basis) when PySCF cannot build the basis (shells it does not read)."""
    mol = gto.Mole()
    mol.atom = [
        (GHOST_PREFIX + s if geom.is_ghost(i) else s, tuple(c))
        for i, (s, c) in enumerate(zip(geom.symbols, geom.coords_angstrom))
    ]
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.ecp = dict(ecps)
    mol.charge = charge
    mol.spin = spin
    mol.verbose = 0
    try:
        mol.build()
    except (ValueError, TypeError, IndexError, KeyError, AssertionError, RuntimeError) as e:
        if isinstance(basis, str):
            raise
        raise InputError(
            f"PySCF cannot build the basis {basis_text(basis)}: {shown(str(e), 80)}", option="basis"
        ) from None
    return mol


def linear_dependence(mol: gto.Mole) -> tuple[int, float, float]:
    """(nmo, threshold, smallest overlap eigenvalue): the orbitals the RHF keeps. PySCF's SCF
    drops overlap eigenvectors with eigenvalues below ``pyscf.scf.hf.
    overlap_zero_eigenvalue_threshold`` (canonical orthogonalisation); nmo < nbasis then."""
    e = np.linalg.eigvalsh(mol.intor_symmetric("int1e_ovlp"))
    cutoff = overlap_cutoff()
    thr = float(pyscf_hf.overlap_zero_eigenvalue_threshold)
    nmo = int(np.count_nonzero(e > cutoff)) if cutoff is not None else len(e)
    return nmo, thr, float(e[0])


def overlap_cutoff() -> float | None:
    """PySCF's canonical-orthogonalisation rule: overlap eigenvalues at or below this are dropped
    (None: PySCF is set to keep them all). Our DF-RHF (dfmp2.scf.rhf) keeps the same orbitals."""
    if not pyscf_hf.remove_overlap_zero_eigenvalue:
        return None
    return float(pyscf_hf.overlap_zero_eigenvalue_threshold)


def orbital_basis_names(mol: gto.Mole) -> dict:
    """{atom label (``mol._atom``: 'O', 'H1', 'GHOST-H'): that atom's orbital basis name, or None
    where it was given as shells}. ``mol.basis`` is one name, or a dict per element or label with
    an optional 'default' for the atoms it does not name, read as PySCF reads it
    (gto.mole._parse_default_basis, then make_env: the label, then 'default', then the element)."""
    labels = dict.fromkeys(a[0] for a in mol._atom)
    spec = mol.basis
    if isinstance(spec, str) or not isinstance(spec, dict):
        return {a: spec if isinstance(spec, str) else None for a in labels}
    table = {k if k == "default" else _atom_symbol(k): v for k, v in spec.items()}
    out = {}
    for a in labels:
        bare = a.split("-", 1)[1] if a.upper().startswith(("X-", GHOST_PREFIX)) else a
        keys = (a, "default", _rm_digit(a), bare, _rm_digit(bare))
        v = next((table[k] for k in keys if k in table), None)
        out[a] = v if isinstance(v, str) else None
    return out


def frozen_core_count(mol: gto.Mole) -> int:
    """Number of doubly occupied core orbitals frozen by the usual chemical convention."""
    return int(chemcore(mol))
