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
from pyscf.data.elements import chemcore
from pyscf.lib.exceptions import BasisNotFoundError

from .errors import InputError, SCFNotConvergedError
from .xyz import Geometry

SCF_CONV_TOL = 1e-12       # Hartree, energy change
SCF_CONV_TOL_GRAD = 1e-9   # orbital-gradient norm (1e-8 left 2e-10 Eh of thread-count noise in large cases)
SCF_MAX_CYCLE = 100
SCF_MODES = ("df", "exact")


def _check_basis(name: str, elements, kind: str, option: str) -> None:
    """Raise InputError if basis ``name`` lacks any of ``elements``."""
    missing = []
    for el in sorted(set(elements)):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if not gto.basis.load(name, el):
                    missing.append(el)
        except (BasisNotFoundError, KeyError, RuntimeError, OSError):
            missing.append(el)
    if missing:
        raise InputError(f"{kind} '{name}' is not defined for {', '.join(missing)}; "
                         f"choose another with {option}")


def build_molecule(geom: Geometry, basis: str = "cc-pvdz", charge: int | None = None,
                   multiplicity: int | None = None) -> gto.Mole:
    """PySCF molecule for a closed-shell RHF. Options override the XYZ comment; default charge 0."""
    charge = charge if charge is not None else (geom.charge if geom.charge is not None else 0)
    mult = multiplicity if multiplicity is not None else (
        geom.multiplicity if geom.multiplicity is not None else 1)
    where = geom.source or "molecule"
    nelec = sum(gto.charge(s) for s in geom.symbols) - charge
    if nelec <= 0:
        raise InputError(f"{where}: charge {charge:+d} leaves {nelec} electrons")
    if nelec % 2 or mult != 1:
        raise InputError(f"{where}: {nelec} electrons with multiplicity {mult}: open-shell "
                         "molecules are not supported yet (closed-shell RHF only); check the "
                         "charge (--charge) and multiplicity")
    if isinstance(basis, str):
        _check_basis(basis, geom.symbols, "basis", "--basis")
    mol = gto.Mole()
    mol.atom = [(s, tuple(c)) for s, c in zip(geom.symbols, geom.coords_angstrom)]
    mol.unit = "Angstrom"
    mol.basis = basis
    mol.charge = charge
    mol.spin = 0
    mol.verbose = 0
    mol.build()
    return mol


def mp2_auxbasis(mol: gto.Mole, auxbasis: str | None = None):
    """The MP2-fit auxiliary basis: the one given, or the set matched to the orbital basis
    as ``pyscf.df.make_auxbasis(mol, mp2fit=True)`` chooses it (cc-pVDZ -> cc-pVDZ-RI)."""
    elements = [mol.atom_pure_symbol(i) for i in range(mol.natm)]
    if auxbasis is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return df.make_auxbasis(mol, mp2fit=True)
    _check_basis(auxbasis, elements, "auxiliary basis", "--auxbasis")
    return auxbasis


def make_auxmol(mol: gto.Mole, auxbasis) -> gto.Mole:
    """The auxiliary-basis molecule (same atoms, fitting functions)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return df.addons.make_auxmol(mol, auxbasis)


def frozen_core_count(mol: gto.Mole) -> int:
    """Number of doubly occupied core orbitals frozen by the usual chemical convention."""
    return int(chemcore(mol))


def describe_auxbasis(auxbasis) -> str:
    """Short text of an auxiliary basis spec (a name or a per-element dict)."""
    if isinstance(auxbasis, str):
        return auxbasis
    names = sorted({v if isinstance(v, str) else "even-tempered" for v in auxbasis.values()})
    if len(names) == 1:
        return names[0]
    return ", ".join(f"{k}:{v if isinstance(v, str) else 'even-tempered'}"
                     for k, v in sorted(auxbasis.items()))


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


def run_rhf(mol: gto.Mole, scf_mode: str = "df") -> RHFReference:
    """Converge RHF with PySCF: density-fitted (JK-fit basis, PySCF's default) or exact."""
    if scf_mode not in SCF_MODES:
        raise InputError(f"unknown SCF mode '{scf_mode}'; use one of {', '.join(SCF_MODES)}")
    mf = scf.RHF(mol)
    jk_aux = None
    if scf_mode == "df":
        mf = mf.density_fit()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mf.with_df.build()
        jk_aux = describe_auxbasis(mf.with_df.auxbasis)
    mf.conv_tol = SCF_CONV_TOL
    mf.conv_tol_grad = SCF_CONV_TOL_GRAD
    mf.max_cycle = SCF_MAX_CYCLE
    mf.verbose = 0
    cycles = []
    mf.callback = lambda envs: cycles.append(envs.get("cycle"))
    mf.kernel()
    if not mf.converged:
        raise SCFNotConvergedError(
            f"RHF did not converge in {SCF_MAX_CYCLE} cycles (last energy {mf.e_tot:.10f} Eh); "
            "check the geometry, charge and multiplicity")
    nocc = int(np.count_nonzero(mf.mo_occ > 0))
    return RHFReference(mf=mf, e_hf=float(mf.e_tot), mo_coeff=np.asarray(mf.mo_coeff),
                        mo_energy=np.asarray(mf.mo_energy), nocc=nocc, scf_mode=scf_mode,
                        jk_auxbasis=jk_aux, cycles=len(cycles) or None)
