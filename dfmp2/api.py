"""The Python API: a PySCF drop-in DF-MP2 and a one-call energy.

    from pyscf import gto, scf
    import dfmp2
    mol = gto.M(atom="O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="cc-pvdz")
    mf = scf.RHF(mol).density_fit().run()
    pt = dfmp2.DFMP2(mf, frozen=1).run()           # instead of pyscf.mp.dfmp2.DFMP2(mf, frozen=1)
    pt.e_corr, pt.e_corr_os, pt.e_corr_ss, pt.e_tot, pt.e_tot_scs

    r = dfmp2.energy("water.xyz", basis="cc-pvtz", frozen_core=True)   # the Result `dfmp2 run` prints

``DFMP2`` runs this program's DF-MP2 stage (``pipeline.time_mp2_stage``: the same memory plan,
devices and kernels as ``dfmp2 run``) on the orbitals of a converged PySCF RHF; the SCF is not
run again. Energies in Hartree.
"""
from __future__ import annotations

import numpy as np

from .errors import InputError


class DFMP2:
    """DF-MP2 on a converged PySCF RHF (DF-UMP2 on a UHF), with ``pyscf.mp.dfmp2.DFMP2``'s names.

    mf: a converged ``pyscf.scf.RHF``, or ``pyscf.scf.UHF`` for DF-UMP2 (density-fitted or not;
        its orbitals and orbital energies are used as they are). ROHF/GHF and Kohn-Sham
        references are refused (InputError).
    frozen: None (all orbitals correlated), an int n (the n lowest orbitals frozen), or a list of
        orbital indices (0-based, occupied or virtual) left out of the MP2 — PySCF's meaning.
    auxbasis: the MP2 fitting basis (a name, or a per-element dict); None: the MP2-fit set matched
        to the orbital basis (``scf.default_auxbasis(mol, 'mp2')``, e.g. cc-pVDZ-RI). Unlike
        PySCF's DFMP2, which on a density-fitted ``mf`` reuses its JK-fit basis, the default is
        always the MP2-fit set.
    device, precision, memory_mb, simulate, pair_kernel, cpu_blas: as ``dfmp2 run``'s options.

    After ``run()``: e_hf, e_corr, e_corr_os, e_corr_ss, e_tot, emp2, emp2_scs, e_tot_scs
    (Grimme's SCS: 1.2 OS + SS/3), e_corr_sos, e_tot_sos (1.3 OS); nocc and nmo (active, as
    PySCF counts them); auxbasis (its description), naux, timings (s per stage), ran (device,
    engine, kernels, precisions) and warnings (a fallback auxiliary basis for some element).
    """

    def __init__(self, mf, frozen=None, auxbasis=None, device: str = "cpu", precision: str | None = None,
                 memory_mb: float | None = None, simulate: bool = False, pair_kernel: str = "auto",
                 cpu_blas: str = "auto"):
        self._scf, self.mol = mf, getattr(mf, "mol", None)
        self.frozen, self.auxbasis_requested = frozen, auxbasis
        self.device, self.precision, self.memory_mb = device, precision, memory_mb
        self.simulate, self.pair_kernel, self.cpu_blas = simulate, pair_kernel, cpu_blas
        self.e_hf = self.e_corr_os = self.e_corr_ss = None
        self.auxbasis = self.naux = self.timings = self.ran = self.nocc = self.nmo = None
        self.warnings = []

    # --- energies, as PySCF names them -----------------------------------------------------
    @property
    def e_corr(self):
        return None if self.e_corr_os is None else self.e_corr_os + self.e_corr_ss

    emp2 = e_corr

    @property
    def e_tot(self):
        return None if self.e_corr_os is None else self.e_hf + self.e_corr

    @property
    def emp2_scs(self):
        from .result import SCS_OS, SCS_SS
        return None if self.e_corr_os is None else SCS_OS * self.e_corr_os + SCS_SS * self.e_corr_ss

    @property
    def e_tot_scs(self):
        return None if self.e_corr_os is None else self.e_hf + self.emp2_scs

    @property
    def e_corr_sos(self):
        from .result import SOS_OS
        return None if self.e_corr_os is None else SOS_OS * self.e_corr_os

    @property
    def e_tot_sos(self):
        return None if self.e_corr_os is None else self.e_hf + self.e_corr_sos

    # --- running -----------------------------------------------------------------------------
    def run(self) -> "DFMP2":
        """Compute the energies (the MP2 stage only); returns self, as PySCF's ``run``."""
        from . import scf
        from .pipeline import RunOptions, time_mp2_stage
        from .reference import from_pyscf

        ref = from_pyscf(self._scf, self.frozen)
        check_scf_solution(self._scf, self.mol)
        mol = self.mol
        options = RunOptions(device=self.device, precision=self.precision, memory_mb=self.memory_mb,
                             simulate=self.simulate, pair_kernel=self.pair_kernel, cpu_blas=self.cpu_blas)
        options.resolved_precision()      # an impossible device or precision: before any work
        auxbasis = scf.mp2_auxbasis(mol, self.auxbasis_requested)
        auxmol = scf.make_auxmol(mol, auxbasis)
        _, e_os, e_ss, timings, ran = time_mp2_stage(mol, auxmol, ref, options)
        self.e_hf, self.e_corr_os, self.e_corr_ss = ref.e_hf, float(e_os), float(e_ss)
        self.auxbasis, self.naux = scf.describe_auxbasis(auxbasis), auxmol.nao_nr()
        self.timings, self.ran = timings, ran
        self.nocc = ref.channels[0].nocc_active
        self.nmo = int(np.count_nonzero(~ref.channels[0].frozen))
        note = scf.auxbasis_note(mol, auxbasis, "mp2") if self.auxbasis_requested is None else None
        self.warnings = [w for w in (note, ref.gap_warning(), ref.contamination_warning()) if w]
        return self

    def kernel(self):
        """PySCF's ``kernel``: returns (e_corr, t2) with t2 None (amplitudes are never stored)."""
        self.run()
        return self.e_corr, None


SOLUTION_TOL = 1e-4    # Hartree: largest off-diagonal MO Fock element of a converged, canonical mf
                       # (PySCF's default conv_tol_grad leaves ~1e-5; a 0.3 rad rotation ~1e-1)


def check_scf_solution(mf, mol=None) -> None:
    """Refuse (InputError) orbitals that are not the mf's canonical SCF solution: a ``mol`` that
    does not belong to them (another size, or orbitals not orthonormal in its overlap), or a Fock
    matrix (of mf.make_rdm1(), in the MO basis) with an off-diagonal element above SOLUTION_TOL
    or a diagonal that is not mo_energy. ``mol``: the molecule the MP2 will use (default
    mf.mol). One Fock build of the caller's mf."""
    mol = mf.mol if mol is None else mol
    C = np.asarray(mf.mo_coeff)
    Cs = C if C.ndim == 3 else C[None]
    if Cs.shape[1] != mol.nao_nr():
        raise InputError(f"the mf's orbitals span {Cs.shape[1]} basis functions but its molecule has "
                         f"{mol.nao_nr()}: the mf and the molecule do not belong together")
    S = mol.intor_symmetric("int1e_ovlp")
    if max(abs(c.T @ S @ c - np.eye(c.shape[1])).max() for c in Cs) > 1e-6:
        raise InputError("the mf's orbitals are not orthonormal in its molecule's overlap: was the "
                         "molecule replaced after the SCF?")
    fock = np.asarray(mf.get_fock(dm=mf.make_rdm1()))
    focks = fock if fock.ndim == 3 else fock[None]
    eps = np.asarray(mf.mo_energy).reshape(len(Cs), -1)
    for c, f, e in zip(Cs, focks, eps):
        fmo = c.T @ f @ c
        off = abs(fmo - np.diag(np.diag(fmo))).max()
        if off > SOLUTION_TOL or abs(np.diag(fmo) - e).max() > SOLUTION_TOL:
            raise InputError(f"the mf's orbitals are not its canonical SCF solution (largest off-diagonal "
                             f"Fock element {off:.2e} Eh in the MO basis, above {SOLUTION_TOL:g}): were "
                             "they rotated or changed after the SCF? Converge the SCF again")


def energy(molecule, **options):
    """DF-MP2 from a molecule: an XYZ file path (str or Path, Ångström) or a PySCF ``gto.Mole``
    (its atoms, charge and spin; its basis name unless ``basis=`` is given). ``options`` are
    ``pipeline.RunOptions``' fields (basis, auxbasis, frozen_core, ecp, device, precision,
    scf_mode, memory_mb, ...). Returns the ``result.Result`` that ``dfmp2 run`` prints (energies
    in Hartree; ``.render(console)``, ``.to_dict()``, ``.write_json(path)``)."""
    import dataclasses
    from pathlib import Path

    from .pipeline import RunOptions, run, run_geometry

    fields = {f.name for f in dataclasses.fields(RunOptions)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise InputError(f"unknown option(s) {', '.join(unknown)}; use {', '.join(sorted(fields))}")
    if isinstance(molecule, (str, Path)):
        return run(molecule, RunOptions(**options))
    from pyscf import gto
    if not isinstance(molecule, gto.Mole):
        raise InputError(f"energy() takes an XYZ file path or a pyscf.gto.Mole, got {type(molecule).__name__}")
    geom, basis = geometry_from_mole(molecule)
    if "basis" not in options:
        if basis is None:
            raise InputError("the Mole's basis is not one basis name; give basis='...' to energy()")
        options["basis"] = basis
    return run_geometry(geom, RunOptions(**options))


def _refuse_what_is_not_carried(mol) -> None:
    """energy(mol) rebuilds the molecule from its atoms, charge, spin, basis name and ECP; a Mole
    attribute that changes the basis or the Hamiltonian beyond those would be dropped, so it is
    refused (one InputError) instead of giving another molecule's energy. DFMP2(mf) takes the
    mf's orbitals and integrals as they are and honours them all."""
    changed = []
    if mol.cart:
        changed.append("cart=True (Cartesian d and f functions)")
    if mol.nucmod:
        changed.append(f"nucmod={mol.nucmod!r} (finite nuclei)")
    if mol.nucprop:
        changed.append(f"nucprop={mol.nucprop!r}")
    if float(mol.omega or 0.0) != 0.0:
        changed.append(f"omega={mol.omega} (range-separated Coulomb)")
    if changed:
        raise InputError(f"energy() rebuilds the molecule and cannot carry the Mole's {', '.join(changed)}; "
                         "run the SCF in PySCF and use dfmp2.DFMP2(mf), which honours it")


def geometry_from_mole(mol):
    """(Geometry, basis name or None) of a PySCF Mole: element symbols, coordinates in Ångström,
    charge, multiplicity 2S+1. An ECP set by hand on the Mole is refused unless it is the
    basis's own (``ecp=`` the basis name), which ``ecp='auto'`` attaches anyway."""
    from pyscf import gto

    from . import scf
    from .xyz import Geometry
    if not mol._built:
        mol.build()
    _refuse_what_is_not_carried(mol)
    names = set(scf.orbital_basis_names(mol).values())     # {'H': 'cc-pvdz', 'O': 'cc-pvdz'}: one name
    basis = names.pop() if len(names) == 1 and None not in names else None
    ecp = mol.ecp
    names = set(ecp.values()) if isinstance(ecp, dict) else ({ecp} if ecp else set())
    if names and names != {basis}:
        raise InputError(f"the Mole's ecp {ecp!r} is not the ECP of its basis; energy() attaches the "
                         "basis's own ECP (ecp='auto') or none (ecp='none')")
    symbols = tuple(scf.element(mol, i) for i in range(mol.natm))
    ghost = tuple(bool(gto.is_ghost_atom(mol.atom_symbol(i))) for i in range(mol.natm))
    geom = Geometry(symbols=symbols, coords_angstrom=np.asarray(mol.atom_coords(unit="Angstrom")),
                    ghost=ghost if any(ghost) else (),
                    charge=int(mol.charge), multiplicity=int(mol.spin) + 1,
                    source=f"pyscf.gto.Mole ({mol.natm} atoms)")
    return geom, basis
