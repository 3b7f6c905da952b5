"""The ASE calculator: dfmp2.ase.DFMP2Calculator on an ase.Atoms gives `dfmp2 run`'s
energy in eV, checked against PySCF's own DF-MP2 (stored in inputs/references.json, and computed
here for an open shell), never against this program's output alone."""

import json
from pathlib import Path

import numpy as np
import pytest

ase = pytest.importorskip("ase", reason="the ASE calculator needs `pip install ase` (the test extra has it)")
from ase import Atoms
from ase.calculators.calculator import PropertyNotImplementedError
from ase.io import read
from ase.units import Hartree

import dfmp2
import dfmp2.df.basis
from dfmp2.ase import DFMP2Calculator
from dfmp2.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
REF = json.loads((ROOT / "inputs" / "references.json").read_text())["references"]["water|cc-pvdz|cc-pvdz-ri|df|ae"]


def water():
    return read(str(ROOT / "inputs" / "water.xyz"))  # ASE reads the XYZ in Ångström


def test_water_energy_is_dfmp2_runs_energy_in_ev_and_pyscfs():
    """E(MP2), E(SCS-MP2) and E(SOS-MP2) of water/cc-pVDZ in eV: PySCF's DF-RHF + DF-MP2 (cc-pVDZ-RI)
    times ase.units.Hartree, to 1e-8 Eh; one calculation serves all three (method is a parameter)."""
    atoms = water()
    atoms.calc = calc = DFMP2Calculator(basis="cc-pvdz")
    e = atoms.get_potential_energy()
    assert abs(e / Hartree - REF["e_mp2"]) <= 1e-8, e / Hartree - REF["e_mp2"]
    assert atoms.get_potential_energy(force_consistent=True) == e  # free_energy, ASE's spelling
    r = calc.result
    assert (r.basis, r.auxbasis, r.ran["device"]) == ("cc-pvdz", "cc-pvdz-ri", "cpu")
    assert abs(r.e_hf - REF["e_hf"]) <= 1e-8
    for method, os_, ss_ in (("scs-mp2", 1.2, 1 / 3), ("sos-mp2", 1.3, 0.0)):
        calc.set(method=method)  # method alone: the same run's other energy
        want = REF["e_hf"] + os_ * REF["e_os"] + ss_ * REF["e_ss"]
        assert abs(atoms.get_potential_energy() / Hartree - want) <= 1e-8, method
        assert calc.result is r
    calc.set(basis="sto-3g")  # any other parameter: the run is dropped
    assert calc.result is None and not calc.results


def test_same_as_dfmp2_energy_and_geometry_changes_recompute():
    atoms = water()
    atoms.calc = DFMP2Calculator(basis="sto-3g", frozen_core=True)
    e0 = atoms.get_potential_energy()
    assert (
        abs(e0 / Hartree - dfmp2.energy(str(ROOT / "inputs" / "water.xyz"), basis="sto-3g", frozen_core=True).e_mp2)
        <= 1e-10
    )
    atoms.positions[1, 1] += 0.05
    e1 = atoms.get_potential_energy()
    assert e1 != e0 and atoms.calc.result.natm == 3


@pytest.mark.parametrize("magmom", [0, 1])
def test_the_next_geometry_starts_from_the_last_density_and_gives_a_fresh_runs_energy(magmom):
    """After one calculation the SCF of a moved geometry starts from its density (recorded) and
    ends at the energy a new calculator (PySCF's 'minao' guess) gives, to 1e-9 Eh; other options
    start from 'minao' again. magmom 1: water's cation as a doublet (UHF)."""
    atoms = water()
    atoms.set_initial_charges([magmom, 0, 0])
    atoms.set_initial_magnetic_moments([magmom, 0, 0])
    atoms.calc = calc = DFMP2Calculator(basis="cc-pvdz")
    atoms.get_potential_energy()
    assert calc.result.ran["scf"]["guess"].startswith("minao")
    atoms.positions[0, 2] += 0.01
    e1 = atoms.get_potential_energy()
    assert calc.result.ran["scf"]["guess"].startswith("given density")
    fresh = atoms.copy()
    fresh.calc = DFMP2Calculator(basis="cc-pvdz")
    assert abs(fresh.get_potential_energy() - e1) / Hartree <= 1e-9
    assert fresh.calc.result.ran["scf"]["guess"].startswith("minao")
    calc.set(basis="sto-3g")  # another basis: the density does not fit
    atoms.get_potential_energy()
    assert calc.result.ran["scf"]["guess"].startswith("minao")


def test_a_density_of_the_wrong_shape_is_refused_in_one_line():
    from dfmp2.interfaces.api import run
    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions

    with pytest.raises(InputError, match="starting density has shape"):
        run(read_xyz(ROOT / "inputs" / "water.xyz"), RunOptions(basis="sto-3g"), guess=np.eye(3))


def test_open_shell_from_the_atoms_magnetic_moment_matches_pyscf():
    """OH radical: the Atoms' initial magnetic moment (1) makes a doublet, run as DF-UMP2;
    reference PySCF's DF-UHF + DFUMP2 with the same bases."""
    from pyscf import df, gto, scf
    from pyscf.mp.dfump2 import DFUMP2

    atoms = Atoms("OH", positions=[(0, 0, 0), (0, 0, 0.97)], magmoms=[1.0, 0.0])
    atoms.calc = DFMP2Calculator(basis="sto-3g", scf_mode="pyscf-df")
    e = atoms.get_potential_energy() / Hartree
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="sto-3g", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis=dfmp2.df.basis.default_auxbasis(mol, "jk"))
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    pt = DFUMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=dfmp2.df.basis.default_auxbasis(mol, "mp2"))
    pt.kernel()
    assert abs(e - pt.e_tot) <= 1e-8, e - pt.e_tot


def test_forces_are_minus_the_gradient_in_ev_per_angstrom():
    """Forces against central differences of the calculator's own energy (eV/Å), per method."""
    atoms = water()
    atoms.positions += [[0.01, -0.02, 0.005], [-0.01, 0.015, 0.02], [0.005, 0.01, -0.01]]  # no symmetry
    atoms.calc = calc = DFMP2Calculator(basis="6-31g", scf_conv_tol_grad=1e-10)
    f = atoms.get_forces()
    assert atoms.get_potential_energy() / Hartree == pytest.approx(calc.result.e_mp2, abs=1e-12)
    calc.set(method="scs-mp2")  # the same run's energy, the other method's gradient
    f_scs = atoms.get_forces()
    assert np.abs(f_scs - f).max() > 1e-4
    h = 1e-3  # Å
    for i, x in ((0, 2), (2, 0)):
        e = []
        for s in (1, -1):
            a = atoms.copy()
            a.positions[i, x] += s * h
            a.calc = DFMP2Calculator(basis="6-31g", scf_conv_tol_grad=1e-10, method="scs-mp2")
            e.append(a.get_potential_energy())
        assert abs(-(e[0] - e[1]) / (2 * h) - f_scs[i, x]) <= 1e-6 * Hartree / ase.units.Bohr


def test_stress_and_bad_parameters_are_clear_errors():
    atoms = water()
    atoms.calc = DFMP2Calculator(basis="sto-3g")
    with pytest.raises(PropertyNotImplementedError, match="'stress' is not implemented"):
        atoms.get_stress()
    with pytest.raises(InputError, match="unknown method 'ccsd'"):
        DFMP2Calculator(method="ccsd")
    with pytest.raises(InputError, match="no parameter xc"):
        DFMP2Calculator(xc="pbe")
    with pytest.raises(InputError, match="option frozen_core must be True or False"):
        DFMP2Calculator(frozen_core="yes")
    periodic = water()
    periodic.pbc, periodic.cell = True, np.eye(3) * 10
    periodic.calc = DFMP2Calculator(basis="sto-3g")
    with pytest.raises(InputError, match="periodic"):
        periodic.get_potential_energy()


def test_num_threads_sets_torchs_threads_for_the_calculation_only():
    """``num_threads`` (ASE's Psi4 calculator's name): the run's torch threads (``ran.threads``),
    the process's own restored afterwards; 'max' every CPU the process may use; nonsense refused
    when set."""
    import os

    import torch
    from ase.build import molecule

    from dfmp2.ase import DFMP2Calculator

    before = torch.get_num_threads()
    atoms = molecule("H2")
    atoms.calc = DFMP2Calculator(basis="sto-3g", num_threads=1)
    atoms.get_potential_energy()
    assert atoms.calc.result.ran["threads"] == 1 and torch.get_num_threads() == before
    atoms.calc.set(num_threads="max")
    atoms.positions[1, 2] += 0.01
    atoms.get_potential_energy()
    assert atoms.calc.result.ran["threads"] == len(os.sched_getaffinity(0))
    for bad in (0, 1.5, "all", True):
        with pytest.raises(InputError, match="num_threads"):
            DFMP2Calculator(num_threads=bad)
