"""The PySCF bridge: molecule, basis checks and the RHF reference.

PySCF supplies the molecule, the basis sets and the RHF reference; the SCF is converged
tightly (``SCF_CONV_TOL``) because MP2 energies are first-order sensitive to orbital
errors and we compare to 1e-9 Eh.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
from pyscf import df, gto, scf
from pyscf.data.elements import CONFIGURATION, chemcore
from pyscf.df.addons import predefined_auxbasis
from pyscf.gto.basis import _format_basis_name, _is_pople_basis
from pyscf.lib.exceptions import BasisNotFoundError
from pyscf.scf import hf as pyscf_hf

from .errors import InputError, SCFNotConvergedError
from .xyz import Geometry

SCF_CONV_TOL = 1e-12       # Hartree, energy change
SCF_CONV_TOL_GRAD = 1e-9   # orbital-gradient norm (1e-8 left 2e-10 Eh of thread-count noise in large cases)
SCF_MAX_CYCLE = 100
SCF_MODES = ("df", "pyscf-df", "exact")   # df: our DF-RHF (dfmp2.dfhf); pyscf-df: PySCF's; exact: PySCF's RHF
SCF_DF_MODES = ("df", "pyscf-df")          # density-fitted with the JK-fit set (default_auxbasis 'jk')


MIN_ATOM_DISTANCE = 0.1   # Ångström: closer atoms are an input mistake (no ghost atoms yet)

# Default auxiliary bases. Per element: the fitting set matched to the orbital basis (PySCF's rule,
# pyscf.df.addons.predefined_auxbasis: Psi4's table, then the Basis Set Exchange metadata; Pople
# names without their polarisation marks, as pyscf.df.make_auxbasis does: 6-31g** -> 6-31g ->
# cc-pvdz-*), where that set defines the element. Otherwise a fallback: Weigend's
# def2-universal-JKFIT for the DF-SCF and Hättig's def2-TZVPP-RI for MP2, both all-electron
# through Kr and defined for every element there (cc-pvdz-jkfit lacks He, Li, Be, Na, Mg, Ca,
# Sc-Zn; cc-pvdz-ri lacks Ca, Sc-Zn). Beyond Kr these sets are built for the def2 ECPs, so an
# all-electron orbital basis gets PySCF's AutoAux (Stoychev, Auer, Neese, JCTC 13, 554 (2017)),
# generated from the orbital basis itself, instead.
AUX_KINDS = {"jk": "JK-fit", "mp2": "MP2-fit"}
AUX_FALLBACK = {"jk": "def2-universal-jkfit", "mp2": "def2-tzvpp-ri"}
AUX_FALLBACK_MAX_Z = 36
AUTOAUX = "autoaux"


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
    """Raise InputError if basis ``name`` lacks any of ``elements``."""
    missing = [el for el in sorted(set(elements)) if not _defines(name, el)]
    if missing:
        raise InputError(f"{kind} '{name}' is not defined for {', '.join(missing)}; "
                         f"choose another with {option}")


def _refuse_ecp(name: str, elements) -> None:
    """Raise InputError if basis ``name`` is meant to be used with an effective core potential
    for any of ``elements`` (def2-* beyond Kr, *-pp, LANL2DZ): run all-electron without its ECP,
    such a basis is short of core functions and the energies are meaningless. ECPs are not
    supported yet."""
    with_ecp = [el for el in sorted(set(elements)) if _defines(name, el, gto.basis.load_ecp)]
    if with_ecp:
        raise InputError(f"basis '{name}' uses an effective core potential for {', '.join(with_ecp)}, "
                         "and ECPs are not supported yet; choose an all-electron basis (e.g. "
                         "dyall-v2z or sto-3g for heavy elements)")


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
        raise InputError(
            f"{geom.source or 'molecule'}: atoms {i + 1} ({geom.symbols[i]}) and {j + 1} "
            f"({geom.symbols[j]}) are {d[k]:.4f} Å apart, closer than {MIN_ATOM_DISTANCE} Å"
            f"{more}; check the coordinates (Ångström)")


def minimal_basis_size(symbols) -> int:
    """Orbitals in the atoms' occupied ground-state shells (1s; 1s2s2p for C-Ne; ...): the size of
    a minimal basis. 2x this is the most electrons the atoms' occupied shells can hold."""
    n = 0
    for sym in symbols:
        for l, nel in enumerate(CONFIGURATION[gto.charge(sym)]):
            n += -(-nel // (2 * (2 * l + 1))) * (2 * l + 1)
    return n


def build_molecule(geom: Geometry, basis: str = "cc-pvdz", charge: int | None = None,
                   multiplicity: int | None = None) -> gto.Mole:
    """PySCF molecule for a closed-shell RHF. Options override the XYZ comment; default charge 0.

    Refuses (InputError, before any integral) a multiplicity that is not a positive integer or
    not 1, no electrons, an odd count, more electrons than the atoms' occupied shells can hold
    (2 x ``minimal_basis_size``: the rest would sit in diffuse/Rydberg functions and the RHF
    energy is meaningless), no virtual orbital (nocc >= nbasis), and atoms closer than
    MIN_ATOM_DISTANCE Å.
    """
    charge = charge if charge is not None else (geom.charge if geom.charge is not None else 0)
    mult = multiplicity if multiplicity is not None else (
        geom.multiplicity if geom.multiplicity is not None else 1)
    where = geom.source or "molecule"
    check_geometry(geom)
    if mult < 1:
        raise InputError(f"{where}: multiplicity {mult} is not valid (it is 2S+1, a positive "
                         "integer); only 1, the closed-shell singlet, is supported")
    nelec = sum(gto.charge(s) for s in geom.symbols) - charge
    if nelec <= 0:
        raise InputError(f"{where}: charge {charge:+d} leaves {nelec} electrons; check the charge "
                         "(--charge)")
    if nelec % 2 or mult != 1:
        raise InputError(f"{where}: {nelec} electrons with multiplicity {mult}: open-shell "
                         "molecules are not supported yet (closed-shell RHF only); check the "
                         "charge (--charge) and multiplicity")
    capacity = 2 * minimal_basis_size(geom.symbols)
    if nelec > capacity:
        raise InputError(f"{where}: charge {charge:+d} gives {nelec} electrons, more than the "
                         f"{capacity} that the atoms' occupied shells hold; check the charge (--charge)")
    if isinstance(basis, str):
        _check_basis(basis, geom.symbols, "basis", "--basis")
        _refuse_ecp(basis, geom.symbols)
    mol = gto.Mole()
    mol.atom = [(s, tuple(c)) for s, c in zip(geom.symbols, geom.coords_angstrom)]
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.charge = charge
    mol.spin = 0
    mol.verbose = 0
    mol.build()
    if nelec // 2 >= mol.nao_nr():
        raise InputError(f"{where}: {nelec} electrons fill all {mol.nao_nr()} functions of basis "
                         f"'{basis}': no virtual orbitals for MP2; use a larger basis (--basis)")
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
    (None: PySCF is set to keep them all). Our DF-RHF (dfmp2.dfhf) keeps the same orbitals."""
    if not pyscf_hf.remove_overlap_zero_eigenvalue:
        return None
    return float(pyscf_hf.overlap_zero_eigenvalue_threshold)


def _matched_auxbases(mol: gto.Mole, kind: str) -> list[str]:
    """The fitting sets PySCF matches to the orbital basis ``mol.basis`` (first choice first);
    names PySCF cannot load are weeded out per element by ``_defines``."""
    if not isinstance(mol.basis, str):
        return []
    names = [mol.basis]
    alias = _format_basis_name(mol.basis)
    if _is_pople_basis(alias):
        names.append(alias.split("g")[0] + "g")       # 6-31g** -> 6-31g, as make_auxbasis does
    out = []
    for name in names:
        aux = predefined_auxbasis(mol, name, "HF", kind == "mp2")
        if isinstance(aux, str) and aux not in out:
            out.append(aux)
    return out


def default_auxbasis(mol: gto.Mole, kind: str) -> dict:
    """The default auxiliary basis for ``kind`` ('jk': the DF-SCF, 'mp2': the MP2 fit), per
    element symbol: the matched set if it defines the element, else AUX_FALLBACK[kind] (through
    Kr), else AutoAux (see the rule above AUX_KINDS)."""
    matched = _matched_auxbases(mol, kind)
    out = {}
    for i in range(mol.natm):
        el = mol.atom_pure_symbol(i)
        if el in out:
            continue
        name = next((m for m in matched if _defines(m, el)), None)
        if name is None and gto.charge(el) <= AUX_FALLBACK_MAX_Z and _defines(AUX_FALLBACK[kind], el):
            name = AUX_FALLBACK[kind]
        out[el] = name or AUTOAUX
    return out


def auxbasis_note(mol: gto.Mole, auxbasis, kind: str) -> str | None:
    """One line saying which elements got a fallback auxiliary basis instead of the set matched
    to the orbital basis (None when every element has the matched set, or the user chose)."""
    if isinstance(auxbasis, str) or not isinstance(mol.basis, str):
        return None
    matched = _matched_auxbases(mol, kind)
    by_name: dict = {}
    for el, name in auxbasis.items():
        if name not in matched:
            by_name.setdefault(name, []).append(el)
    if not by_name:
        return None
    used = "; ".join(f"{name} used for {', '.join(els)}" for name, els in by_name.items())
    if not matched:
        return f"no {AUX_KINDS[kind]} set is matched to basis {mol.basis}: {used} (fallback)"
    lacking = ", ".join(e for els in by_name.values() for e in els)
    return (f"the {AUX_KINDS[kind]} set matched to basis {mol.basis} ({matched[0]}) lacks "
            f"{lacking}: {used} (fallback)")


def mp2_auxbasis(mol: gto.Mole, auxbasis: str | None = None):
    """The MP2-fit auxiliary basis: the one given, or ``default_auxbasis(mol, 'mp2')``
    (cc-pVDZ -> cc-pVDZ-RI, with fallbacks for the elements it lacks)."""
    if auxbasis is None:
        return default_auxbasis(mol, "mp2")
    elements = [mol.atom_pure_symbol(i) for i in range(mol.natm)]
    _check_basis(auxbasis, elements, "auxiliary basis", "--auxbasis")
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


@dataclass
class RHFReference:
    """The converged RHF reference. Energies in Hartree; mo_coeff (nao, nmo); nocc doubly occupied."""

    mf: object
    e_hf: float
    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    nocc: int
    scf_mode: str
    jk_auxbasis: str | None
    cycles: int | None
    ran: dict | None = None     # what ran the SCF (engine, device, kernels, times); None from a checkpoint


def run_rhf(mol: gto.Mole, scf_mode: str = "pyscf-df", max_cycle: int = SCF_MAX_CYCLE) -> RHFReference:
    """Converge RHF with PySCF on the host: density-fitted (``default_auxbasis(mol, 'jk')``: the
    JK-fit set matched to the basis, with fallbacks for the elements it lacks; 'pyscf-df', or
    'df', the name the references use for the same DF-RHF) or exact. ``dfmp2 run``'s default
    'df' is our own DF-RHF on the run's device, ``dfmp2.dfhf.run_dfhf``, not this."""
    if scf_mode not in SCF_MODES:
        raise InputError(f"unknown SCF mode '{scf_mode}'; use one of {', '.join(SCF_MODES)}")
    mf = scf.RHF(mol)
    jk_aux = None
    if scf_mode in SCF_DF_MODES:
        jk_spec = default_auxbasis(mol, "jk")
        mf = mf.density_fit(auxbasis=_copy(jk_spec))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mf.with_df.build()
        jk_aux = describe_auxbasis(jk_spec)
    mf.conv_tol = SCF_CONV_TOL
    mf.conv_tol_grad = SCF_CONV_TOL_GRAD
    mf.max_cycle = max_cycle
    mf.verbose = 0
    cycles = []
    mf.callback = lambda envs: cycles.append(envs.get("cycle"))
    mf.kernel()
    if not mf.converged:
        raise SCFNotConvergedError(
            f"RHF did not converge in {max_cycle} cycles (last energy {mf.e_tot:.10f} Eh); "
            "check the geometry, charge and multiplicity")
    nocc = int(np.count_nonzero(mf.mo_occ > 0))
    return RHFReference(mf=mf, e_hf=float(mf.e_tot), mo_coeff=np.asarray(mf.mo_coeff),
                        mo_energy=np.asarray(mf.mo_energy), nocc=nocc, scf_mode=scf_mode,
                        jk_auxbasis=jk_aux, cycles=len(cycles) or None,
                        ran={"engine": "pyscf", "device": "host", "precision": "fp64",
                             "iterations": len(cycles) or None,
                             "jk": "pyscf.df (DF-J/K)" if jk_aux else "pyscf (exact J/K)"})
