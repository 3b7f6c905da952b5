"""The PySCF bridge: molecule, basis checks and the RHF reference.

PySCF supplies the molecule, the basis sets and the RHF reference; the SCF is converged
tightly (``SCF_CONV_TOL``) because MP2 energies are first-order sensitive to orbital
errors and we compare to 1e-9 Eh.
"""
from __future__ import annotations

import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
from pyscf import df, gto, lib, scf
from pyscf.data.elements import CONFIGURATION, _atom_symbol, _rm_digit, _std_symbol_without_ghost, chemcore
from pyscf.df.addons import predefined_auxbasis
from pyscf.gto.basis import _format_basis_name, _is_pople_basis
from pyscf.lib.exceptions import BasisNotFoundError
from pyscf.scf import hf as pyscf_hf

from dfmp2.io import tempdirs
from dfmp2.errors import InputError, SCFNotConvergedError
from dfmp2.provenance import ScfRecord, cycle_precision
from dfmp2.reference import S2_WARN, Reference, from_pyscf  # noqa: F401 (S2_WARN: the result's spin block)
from dfmp2.options import (ECP_CHOICES, REFERENCES, SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_DF_MODES,  # noqa: F401
                      SCF_MAX_CYCLE, SCF_MODES)
from dfmp2.io.xyz import Geometry


MIN_ATOM_DISTANCE = 0.1   # Ångström: closer atoms (ghosts included) are an input mistake

# Ghost atoms (counterpoise corrections, dfmp2.workflows.interaction): a Geometry atom with ghost=True
# becomes PySCF's 'GHOST-<El>' atom: no nuclear charge, no electrons, no frozen core
# (pyscf.data.elements.chemcore counts them as Z = 0), but the orbital basis and, through
# default_auxbasis (keyed by the real element), both fitting sets of its element. Everything
# that reads the Mole (hcore, energy_nuc, any SCF engine, the MP2 stage) sees them that way.
GHOST_PREFIX = "GHOST-"


def element(mol: gto.Mole, i: int) -> str:
    """The element of atom ``i`` whether it is a ghost or not ('GHOST-O' -> 'O')."""
    return _std_symbol_without_ghost(mol.atom_pure_symbol(i))

# Default auxiliary bases. Per atom kind (an element, or an atom label where atoms of one element
# carry different orbital bases): the orbital basis of that atom (``mol.basis`` a name, or a dict
# per element/label with an optional 'default', looked up as PySCF's make_env does), then the
# fitting sets matched to it (PySCF's rule, pyscf.df.addons.predefined_auxbasis: Psi4's table,
# then the Basis Set Exchange metadata; Pople names without their polarisation marks, as
# pyscf.df.make_auxbasis does: 6-31g** -> 6-31g -> cc-pvdz-*; then the set the BSE metadata
# names for that orbital basis: def2-SVP -> def2-SVP-RIFIT), the first that defines the element.
# Sets that only the Basis Set Exchange package has (no PySCF basis file: def2-SVP-RIFIT and
# def2-TZVP-RIFIT, Hellweg et al. 2007, for Rb-Rn; cc-pVXZ-PP-RIFIT) are taken beyond Kr, for an
# element carrying an ECP (they are made for the def2/PP ECPs), so that nothing through Kr depends
# on whether that package is installed. Otherwise a fallback: Weigend's def2-universal-JKFIT for
# the DF-SCF and Hättig's def2-TZVPP-RI for MP2, both all-electron through Kr and defined for every
# element there (cc-pvdz-jkfit lacks He, Li, Be, Na, Mg, Ca, Sc-Zn; cc-pvdz-ri lacks Ca, Sc-Zn).
# Beyond Kr these sets are built for the def2 ECPs: an element carrying an ECP gets them where
# PySCF has them (def2-universal-jkfit does, PySCF's def2-*-ri files stop at Kr), an all-electron
# one gets PySCF's AutoAux (Stoychev, Auer, Neese, JCTC 13, 554 (2017)), generated from the
# orbital basis itself, instead; so does an atom whose orbital basis was given as shells.
AUX_KINDS = {"jk": "JK-fit", "mp2": "MP2-fit"}
AUX_FALLBACK = {"jk": "def2-universal-jkfit", "mp2": "def2-tzvpp-ri"}
AUX_FALLBACK_MAX_Z = 36
AUTOAUX = "autoaux"
BSE_AUX_ROLE = {"jk": "jkfit", "mp2": "rifit"}     # the BSE metadata's names of the two roles
BSE_PACKAGE = "basis-set-exchange"


def bse_version() -> str | None:
    """The installed Basis Set Exchange package's version (None: not installed). PySCF's basis
    loader reads a set that is not among its own files through that package."""
    try:
        import basis_set_exchange
    except ImportError:
        return None
    return str(basis_set_exchange.version())


def from_bse(name: str) -> bool:
    """Whether basis ``name`` is one that only the Basis Set Exchange package supplies (the BSE
    knows it, PySCF has no file for it): def2-svp-rifit, cc-pvdz-pp-rifit."""
    alias = _format_basis_name(name)
    return alias not in gto.basis.ALIAS and alias in getattr(gto.mole, "BSE_META", {})


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
        raise InputError(f"{kind} '{name}' is not defined for {', '.join(missing)}; "
                         f"choose another {kind}", option=option)


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
    return [el for el in sorted(set(elements))
            if gto.charge(el) in meta[1] and not _defines(basis, el, gto.basis.load_ecp)]


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
    with_ecp = ecp_core_electrons(basis, elements)
    if not with_ecp:
        return None
    return (f"ECP off (ecp 'none-for-testing'): basis {basis} is made for an effective core potential "
            f"on {', '.join(with_ecp)}; run all-electron it lacks core functions and the energies "
            "are meaningless (keep the basis's ECP, ecp 'auto', or choose an all-electron basis)")


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
            f"{more}; check the coordinates (Ångström)")


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
    nelec = sum(gto.charge(s) for s in geom.real_symbols) - charge     # ghosts have none
    mult = multiplicity if multiplicity is not None else (
        geom.multiplicity if geom.multiplicity is not None else 1 + nelec % 2)
    return charge, mult, nelec


def resolve_reference(reference: str, geom: Geometry, charge: int | None = None,
                      multiplicity: int | None = None) -> str:
    """'rhf' or 'uhf' for the ``reference`` option (auto: RHF for a closed shell, UHF otherwise). ROHF is
    refused, and so is RHF for an open shell (InputError, before any integral)."""
    if reference not in REFERENCES:
        raise InputError(f"unknown reference '{reference}'; use one of {', '.join(REFERENCES)}",
                         option="reference")
    if reference == "rohf":
        raise InputError("ROHF references are not supported (ROHF-MP2 needs semicanonical orbitals "
                         "and a singles term); use a UHF reference (the default for open shells)",
                         option="reference")
    _, mult, nelec = electron_count(geom, charge, multiplicity)
    open_shell = mult != 1 or nelec % 2 == 1
    if reference == "rhf" and open_shell:
        raise InputError(f"{geom.source or 'molecule'}: RHF needs a closed shell, but {nelec} electrons "
                         f"with multiplicity {mult} is open-shell; use a UHF reference (uhf or auto)",
                         option="reference")
    if reference == "auto":
        return "uhf" if open_shell else "rhf"
    return reference


def build_molecule(geom: Geometry, basis: str = "cc-pvdz", charge: int | None = None,
                   multiplicity: int | None = None, ecp: str = "auto") -> gto.Mole:
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
        raise InputError(f"{where}: multiplicity {mult} is not valid (it is 2S+1, a positive "
                         "integer; 1 for a closed shell, 2 for a doublet, 3 for a triplet)",
                         option="multiplicity")
    if isinstance(basis, str):
        _check_basis(basis, geom.symbols, "basis", "basis")
    real = geom.real_symbols          # ghosts carry neither electrons nor an ECP
    if not real:
        raise InputError(f"{where}: every atom is a ghost; at least one real atom is needed")
    ecp_core = ecp_core_electrons(basis, real)
    lost = ecp_not_attached(basis, real) if ecp != "none-for-testing" else []
    if lost:
        raise InputError(f"{where}: basis {basis} for {', '.join(lost)} is made for an effective core "
                         "potential that PySCF does not attach (its orbital basis alone would come from the "
                         "Basis Set Exchange); choose another basis", option="basis")
    if ecp == "none" and ecp_core:
        raise InputError(f"{where}: basis {basis} is made for an effective core potential on "
                         f"{', '.join(ecp_core)}; all-electron it lacks core functions and its energies are "
                         "meaningless; keep its ECP (auto), choose an all-electron basis, or, to run it "
                         "anyway for a test, ecp 'none-for-testing'", option="ecp")
    ecp_core = ecp_core if ecp == "auto" else {}
    n_ecp = sum(ecp_core.get(s, 0) for s in real)     # even per atom: parity and multiplicity unchanged
    nelec -= n_ecp
    outside = f" outside the ECP cores ({n_ecp} electrons)" if n_ecp else ""
    if nelec <= 0:
        raise InputError(f"{where}: charge {charge:+d} leaves {nelec} electrons{outside}; check the charge",
                         option="charge")
    unpaired = mult - 1
    if unpaired > nelec:
        raise InputError(f"{where}: multiplicity {mult} needs {unpaired} unpaired electrons but the "
                         f"molecule has only {nelec}{outside}; check the charge and multiplicity",
                         option=("charge", "multiplicity"))
    if (nelec - unpaired) % 2:
        raise InputError(f"{where}: {nelec} electrons cannot have multiplicity {mult}: an "
                         f"{'even' if nelec % 2 == 0 else 'odd'} electron count needs an "
                         f"{'odd' if nelec % 2 == 0 else 'even'} multiplicity (2S+1); check the "
                         "charge and multiplicity", option=("charge", "multiplicity"))
    capacity = 2 * minimal_basis_size(real) - n_ecp     # ECP cores are filled shells
    if nelec > capacity:
        raise InputError(f"{where}: charge {charge:+d} gives {nelec} electrons{outside}, more than the "
                         f"{capacity} that the atoms' occupied shells hold; check the charge",
                         option="charge")
    mol = gto.Mole()
    mol.atom = [(GHOST_PREFIX + s if geom.is_ghost(i) else s, tuple(c))
                for i, (s, c) in enumerate(zip(geom.symbols, geom.coords_angstrom))]
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.ecp = {el: basis for el in ecp_core}
    mol.charge = charge
    mol.spin = unpaired
    mol.verbose = 0
    mol.build()
    if (nelec + unpaired) // 2 >= mol.nao_nr():
        raise InputError(f"{where}: {nelec} electrons fill all {mol.nao_nr()} functions of basis "
                         f"'{basis}': no virtual orbitals for MP2; use a larger basis", option="basis")
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
    (None: PySCF is set to keep them all). Our DF-RHF (dfmp2.scf.dfhf) keeps the same orbitals."""
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


def _aux_keys(mol: gto.Mole) -> dict:
    """{key of the auxiliary-basis dict: (element, orbital basis name or None)}: the element where
    all its atoms (ghosts included) carry one orbital basis, else each atom label on its own
    (PySCF's make_auxmol looks a label up before its element)."""
    names = orbital_basis_names(mol)
    by_el: dict = {}
    for i in range(mol.natm):
        label = mol._atom[i][0]
        by_el.setdefault(element(mol, i), {})[label] = names[label]
    out = {}
    for el, labels in by_el.items():
        if len(set(labels.values())) == 1:
            out[el] = (el, next(iter(labels.values())))
        else:
            out.update({label: (el, obs) for label, obs in labels.items()})
    return out


def _matched_sets(mol: gto.Mole, obs: str | None, kind: str) -> list[str]:
    """The fitting sets matched to orbital basis ``obs`` (first choice first; [] for shells):
    PySCF's choice (``predefined_auxbasis``) and the BSE metadata's, for the name and for its
    Pople stem (6-31g** -> 6-31g, as make_auxbasis does); whether one defines an element is
    decided per element (``_default_set``)."""
    if not isinstance(obs, str):
        return []
    names = [obs]
    alias = _format_basis_name(obs)
    if _is_pople_basis(alias):
        names.append(alias.split("g")[0] + "g")
    out = []
    for name in names:
        meta = getattr(gto.mole, "BSE_META", {}).get(_format_basis_name(name).lower())
        bse_aux = meta[2].get(BSE_AUX_ROLE[kind]) if meta else None
        for aux in (predefined_auxbasis(mol, name, "HF", kind == "mp2"), bse_aux):
            if isinstance(aux, str) and aux not in out:
                out.append(aux)
    return out


def _default_set(mol: gto.Mole, el: str, obs: str | None, kind: str, has_ecp: bool) -> str:
    """The default fitting set of ``kind`` for element ``el`` with orbital basis ``obs`` (the rule
    above AUX_KINDS): a matched set, the def2 fallback, else AUTOAUX. A set only the Basis Set
    Exchange package has, needed while that package is missing, is an InputError naming it."""
    beyond_kr = gto.charge(el) > AUX_FALLBACK_MAX_Z
    for name in _matched_sets(mol, obs, kind):
        if from_bse(name):
            if not (beyond_kr and has_ecp):
                continue
            if bse_version() is None:
                raise InputError(f"the {AUX_KINDS[kind]} set matched to basis {obs} for {el} is {name}, "
                                 f"published in the Basis Set Exchange, whose package is not installed; "
                                 f"install it (pip install {BSE_PACKAGE}; a dependency of dfmp2)")
        if _defines(name, el):
            return name
    if (not beyond_kr or has_ecp) and _defines(AUX_FALLBACK[kind], el):
        return AUX_FALLBACK[kind]
    return AUTOAUX


def default_auxbasis(mol: gto.Mole, kind: str) -> dict:
    """The default auxiliary basis for ``kind`` ('jk': the DF-SCF, 'mp2': the MP2 fit), per element
    symbol (per atom label where atoms of one element carry different orbital bases, see
    ``_aux_keys``): the matched set if it defines the element (the Basis Set Exchange's published
    sets beyond Kr included), else AUX_FALLBACK[kind] (through Kr, and beyond Kr for an element
    carrying an ECP: the def2 fitting sets are made for the def2 ECPs), else AutoAux (see the rule
    above AUX_KINDS), else, where PySCF's AutoAux cannot be generated from the orbital basis
    (LANL2DZ's s/p-only shells of I and Sn: an IndexError inside it), PySCF's own default for an
    unknown basis, the even-tempered set of ``df.addons.aug_etb``. The result's warnings name
    every fallback and every set taken from the Basis Set Exchange (``auxbasis_note``)."""
    with_ecp = {element(mol, i) for i in range(mol.natm) if mol.atom_nelec_core(i)}
    out = {key: _default_set(mol, el, obs, kind, el in with_ecp)   # a ghost atom: its element's set
           for key, (el, obs) in _aux_keys(mol).items()}
    if AUTOAUX in out.values():
        try:
            make_auxmol(mol, out)
        except (IndexError, KeyError, ValueError, RuntimeError):
            etb = df.addons.aug_etb(mol)
            out = {key: name if name != AUTOAUX else etb.get(key, etb.get(GHOST_PREFIX + key))
                   for key, name in out.items()}
    return out


def auxbasis_note(mol: gto.Mole, auxbasis, kind: str) -> str | None:
    """One line saying which elements got a fallback auxiliary basis instead of the set matched
    to their orbital basis, and which got a published set from the Basis Set Exchange package
    (not among PySCF's own files: PySCF's make_auxbasis gives those elements even-tempered sets);
    None when every element has a matched set from PySCF's files, or the user chose."""
    if isinstance(auxbasis, str):
        return None
    fallback: dict = {}      # orbital basis -> {fitting set: [keys]}
    bse: dict = {}           # fitting set -> [keys]
    for key, (_, obs) in _aux_keys(mol).items():
        name = auxbasis.get(key)
        matched = _matched_sets(mol, obs, kind)
        if isinstance(name, str) and name in matched:
            if from_bse(name):
                bse.setdefault(name, []).append(key)
            continue
        label = name if isinstance(name, str) else "even-tempered"
        fallback.setdefault(obs, {}).setdefault(label, []).append(key)
    parts = [f"{name} used for {', '.join(keys)} (the published {AUX_KINDS[kind]} set from the Basis "
             f"Set Exchange, {BSE_PACKAGE} {bse_version()}; PySCF's own basis files lack it)"
             for name, keys in bse.items()]
    for obs, by_name in fallback.items():
        used = "; ".join(f"{name} used for {', '.join(keys)}" for name, keys in by_name.items())
        matched = _matched_sets(mol, obs, kind)
        if obs is None:
            parts.append(f"no {AUX_KINDS[kind]} set is matched to an orbital basis given as shells: {used} (fallback)")
        elif not matched:
            parts.append(f"no {AUX_KINDS[kind]} set is matched to basis {obs}: {used} (fallback)")
        else:
            lacking = ", ".join(k for keys in by_name.values() for k in keys)
            parts.append(f"the {AUX_KINDS[kind]} set matched to basis {obs} ({matched[0]}) lacks "
                         f"{lacking}: {used} (fallback)")
    return "; ".join(parts) or None


def mp2_auxbasis(mol: gto.Mole, auxbasis: str | dict | None = None):
    """The MP2-fit auxiliary basis: the one given (a name, or {element: name or PySCF shells}
    covering every element), or ``default_auxbasis(mol, 'mp2')`` (cc-pVDZ -> cc-pVDZ-RI, with
    fallbacks for the elements it lacks)."""
    if auxbasis is None:
        return default_auxbasis(mol, "mp2")
    elements = [element(mol, i) for i in range(mol.natm)]
    if isinstance(auxbasis, dict):
        missing = sorted(set(elements) - set(auxbasis))
        if missing:
            raise InputError(f"the auxiliary basis given per element has no entry for {', '.join(missing)}",
                             option="auxbasis")
        for el in sorted(set(elements)):
            if isinstance(auxbasis[el], str):
                _check_basis(auxbasis[el], [el], "auxiliary basis", "auxbasis")
        return {el: auxbasis[el] for el in dict.fromkeys(elements)}
    _check_basis(auxbasis, elements, "auxiliary basis", "auxbasis")
    return auxbasis


def is_fitting_set(name: str) -> bool:
    """Whether a basis name is a density-fitting set (JK-fit, RI/MP2-fit, J-fit, AutoAux)."""
    n = _format_basis_name(name)
    return ("fit" in n or n.endswith("ri") or n == AUTOAUX
            or n.startswith(("weigend", "ahlrichs", "demon")))


def make_auxmol(mol: gto.Mole, auxbasis) -> gto.Mole:
    """The auxiliary-basis molecule (same atoms, fitting functions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return df.addons.make_auxmol(mol, _copy(auxbasis))


def _copy(auxbasis):
    """PySCF replaces 'autoaux' entries of a dict spec by the generated shells in place."""
    return dict(auxbasis) if isinstance(auxbasis, dict) else auxbasis


def frozen_core_count(mol: gto.Mole) -> int:
    """Number of doubly occupied core orbitals frozen by the usual chemical convention."""
    return int(chemcore(mol))


def describe_auxbasis(auxbasis) -> str:
    """Short text of an auxiliary basis spec: a name, or per element 'name (El, El) + name (El)'
    when the elements have different sets (a generated one reads 'even-tempered')."""
    if isinstance(auxbasis, str):
        return auxbasis
    by_name: dict = {}
    for el, v in auxbasis.items():
        by_name.setdefault(v if isinstance(v, str) else "even-tempered", []).append(el)
    if len(by_name) == 1:
        return next(iter(by_name))
    fallbacks = {*AUX_FALLBACK.values(), AUTOAUX, "even-tempered"}
    order = sorted(by_name, key=lambda name: name in fallbacks)   # matched set first
    return " + ".join(f"{name} ({', '.join(by_name[name])})" for name in order)


# PySCF keeps its DF tensor in memory while it fits in this share of the memory limit (PySCF's
# own rule: 0.9 of max_memory), else in a file in the run's scratch directory.
PYSCF_DF_INCORE_SHARE = 0.9


def pyscf_df_mb(mol: gto.Mole) -> float:
    """PySCF's DF-SCF tensor (JK-fit set ``default_auxbasis(mol, 'jk')``): naux_jk x
    nbasis(nbasis+1)/2 fp64, in MB (1e6 B)."""
    nao = mol.nao_nr()
    naux = make_auxmol(mol, default_auxbasis(mol, "jk")).nao_nr()
    return naux * nao * (nao + 1) // 2 * 8 / 1e6


def pyscf_df_disk_mb(mol: gto.Mole, memory_mb: float) -> float:
    """The MB PySCF's DF tensor (``pyscf_df_mb``) puts on disk under the memory limit ``memory_mb``
    (MB): all of it when it does not fit PYSCF_DF_INCORE_SHARE of the limit, else 0. Decided
    here, before the run, so that the disk check counts it and PySCF does what was planned."""
    mb = pyscf_df_mb(mol)
    return mb if mb >= PYSCF_DF_INCORE_SHARE * memory_mb else 0.0


@contextlib.contextmanager
def pyscf_scratch(parent=None):
    """A private directory under ``parent`` (default: the system's temp directory, as for our own
    scratch files) for every file PySCF writes meanwhile: PySCF reads ``lib.param.TMPDIR`` when
    it makes a temporary file (its DF tensor, swap files, the SCF's chkfile), and it is pointed
    here; removed on exit, however the block ends. Yields the directory (a Path)."""
    d = Path(tempfile.mkdtemp(prefix="dfmp2-pyscf-", dir=parent))
    tempdirs.register(d)
    old, lib.param.TMPDIR = lib.param.TMPDIR, str(d)
    try:
        yield d
    finally:
        lib.param.TMPDIR = old
        shutil.rmtree(d, ignore_errors=True)
        tempdirs.unregister(d)


def _release_files(mf) -> None:
    """Close the temporary files PySCF's ``mf`` holds (its chkfile, a DF tensor file), so they are
    removed now, inside ``pyscf_scratch``, rather than at a later garbage collection."""
    for owner, name in ((mf, "_chkfile"), (getattr(mf, "with_df", None), "_cderi_to_save")):
        f = getattr(owner, name, None)
        if f is not None and hasattr(f, "close"):
            with contextlib.suppress(OSError):
                f.close()


def run_rhf(mol: gto.Mole, scf_mode: str = "pyscf-df", max_cycle: int = SCF_MAX_CYCLE, progress=None,
            conv_tol_grad: float = SCF_CONV_TOL_GRAD, *, memory_mb: float | None = None,
            scratch_dir=None) -> Reference:
    """Converge RHF with PySCF on the host: density-fitted (``default_auxbasis(mol, 'jk')``: the
    JK-fit set matched to the basis, with fallbacks for the elements it lacks; 'pyscf-df', or
    'df', the name the references use for the same DF-RHF) or exact. ``dfmp2 run``'s default
    'df' is our own DF-RHF on the run's device, ``dfmp2.scf.dfhf.run_dfhf``, not this.
    ``progress(cycle, e_tot, d_e, gnorm)`` after each cycle (PySCF's gradient norm).
    ``memory_mb``: PySCF's ``max_memory`` (MB; default PySCF's own); its DF tensor is kept in
    memory or written to a file as ``pyscf_df_disk_mb`` decides. Every file PySCF writes goes to
    a private directory under ``scratch_dir`` (``pyscf_scratch``), removed when this returns."""
    return _run_pyscf(scf.RHF, mol, scf_mode, max_cycle, "RHF", progress, conv_tol_grad, memory_mb, scratch_dir)


def run_uhf(mol: gto.Mole, scf_mode: str = "pyscf-df", max_cycle: int = SCF_MAX_CYCLE, progress=None,
            conv_tol_grad: float = SCF_CONV_TOL_GRAD, *, memory_mb: float | None = None,
            scratch_dir=None) -> Reference:
    """Converge UHF with PySCF on the host (``scf.UHF``; density-fitted as ``run_rhf``, same
    JK-fit set and thresholds, for 'df' and 'pyscf-df': the cross-check of our DF-UHF, dfhf.DFUHF;
    or exact), for ``mol.spin`` = n_alpha - n_beta. ``progress``, ``memory_mb`` and
    ``scratch_dir`` as ``run_rhf``'s."""
    return _run_pyscf(scf.UHF, mol, scf_mode, max_cycle, "UHF", progress, conv_tol_grad, memory_mb, scratch_dir)


def not_converged(what: str, cycles: int, e_tot: float, d_e: float, gnorm: float,
                  conv_tol_grad: float) -> SCFNotConvergedError:
    """The error of an SCF that stopped unconverged after ``cycles``: what did not converge and by
    how much (never the input's fault). Its option: the gradient threshold when the energy had
    converged (a gradient that stalls just above it), else the cycle limit."""
    energy_ok = abs(d_e) < SCF_CONV_TOL
    return SCFNotConvergedError(
        f"{what} did not converge in {cycles} cycles: the last energy change {d_e:.1e} Eh "
        f"({'below' if energy_ok else 'above'} the threshold {SCF_CONV_TOL:g}) and orbital-gradient norm "
        f"{gnorm:.1e} (threshold {conv_tol_grad:g}), last energy {e_tot:.10f} Eh; "
        + ("loosen the gradient threshold if that energy is converged enough for you"
           if energy_ok else "raise the cycle limit"),
        option="scf_conv_tol_grad" if energy_ok else "scf_max_cycle")


def _run_pyscf(cls, mol: gto.Mole, scf_mode: str, max_cycle: int, what: str, progress=None,
               conv_tol_grad: float = SCF_CONV_TOL_GRAD, memory_mb: float | None = None,
               scratch_dir=None) -> Reference:
    """``cls(mol)`` (PySCF's RHF or UHF) density-fitted (JK-fit set ``default_auxbasis(mol,
    'jk')``) or not, converged to SCF_CONV_TOL / SCF_CONV_TOL_GRAD, with its files in
    ``pyscf_scratch(scratch_dir)``; the Reference (``reference.from_pyscf``) with its record.
    SCFNotConvergedError if it does not converge."""
    if scf_mode not in SCF_MODES:
        raise InputError(f"unknown SCF mode '{scf_mode}'; use one of {', '.join(SCF_MODES)}", option="scf_mode")
    made = []                               # the SCF objects made, whose files are closed at the end
    with pyscf_scratch(scratch_dir) as tmp:
        try:
            return _converge(cls(mol), mol, scf_mode, max_cycle, what, progress, conv_tol_grad, memory_mb,
                             tmp, made)
        finally:
            for mf in made:
                _release_files(mf)


def _converge(mf, mol, scf_mode, max_cycle, what, progress, conv_tol_grad, memory_mb, tmp: Path,
              made: list) -> Reference:
    """``_run_pyscf``'s SCF in the scratch directory ``tmp``; each SCF object made is put in ``made``."""
    jk_aux, df_storage = None, None
    made.append(mf)
    mf.chkfile = None                       # nothing reads it: PySCF writes none
    if memory_mb is not None:
        mf.max_memory = float(memory_mb)
    if scf_mode in SCF_DF_MODES:
        jk_spec = default_auxbasis(mol, "jk")
        mf = mf.density_fit(auxbasis=_copy(jk_spec))
        made.append(mf)
        mf.with_df.max_memory = mf.max_memory
        on_disk = pyscf_df_disk_mb(mol, mf.max_memory) > 0
        if on_disk:                         # a path: PySCF writes the tensor there, whatever its memory
            mf.with_df._cderi_to_save = str(tmp / "pyscf-df-tensor.h5")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mf.with_df.build()
        jk_aux = describe_auxbasis(jk_spec)
        df_storage = "disk" if on_disk else "memory"
    mf.conv_tol = SCF_CONV_TOL
    mf.conv_tol_grad = conv_tol_grad
    mf.max_cycle = max_cycle
    mf.verbose = 0
    cycles = []

    def callback(envs):
        cycles.append((envs["cycle"] + 1, float(envs["e_tot"]), float(envs["e_tot"] - envs["last_hf_e"]),
                       float(envs["norm_gorb"])))
        if progress is not None:
            progress(*cycles[-1], "fp64")
    mf.callback = callback
    mf.kernel()
    if not mf.converged:
        raise not_converged(what, *(cycles[-1] if cycles else (0, float(mf.e_tot), float("nan"), float("nan"))),
                            conv_tol_grad)
    record = ScfRecord(engine="pyscf", reference=what, device="host", source="ran", conv_tol_grad=conv_tol_grad,
                       iterations=len(cycles) or None, jk_auxbasis=jk_aux,
                       jk="pyscf.df (DF-J/K)" if jk_aux else "pyscf (exact J/K)", df_tensor=df_storage,
                       cycle_precision=cycle_precision("fp64", None, why="PySCF's SCF (fp64 on the host)",
                                                       fp64_cycles=len(cycles)))
    return from_pyscf(mf, scf=record, jk_auxbasis=jk_aux)
