"""A closed-shell double hybrid's gradient (dfmp2.grad.dh) through every route MP2's takes:
``dfmp2 optimize`` and ``dfmp2 frequencies --method``, ASE forces, QCSchema's gradient and hessian
drivers, the Python API. References that do not come from the route under test: ``dfmp2.gradient``
itself (a route passes its molecule and options on unchanged), and, for the Hessian, second
differences of our own double-hybrid energies (``dfmp2 run --method``: hessian_fd). IR intensities
come from the relaxed double-hybrid dipole (tests/grad/test_dipole_dh.py checks it).

Water, STO-3G, the KS grid at level 1 (coarse, the same for every run compared) in the fast
tests; the heavy one at the default grid (level 3)."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from gradient_fd import options as fd_options
from hessian_fd import energy_hessian
from pyscf.lib.parameters import BOHR

import dfmp2
from dfmp2.cli.main import main
from dfmp2.io import molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
GRID = 1  # PySCF grids.level of the fast tests' KS-SCF


@pytest.fixture(scope="module")
def api_gradient():
    """dfmp2.gradient's B2PLYP gradient of water/STO-3G (grid level 1): the reference of the routes."""
    return dfmp2.gradient(str(WATER), method="b2plyp", basis="sto-3g", dft_grid=GRID)


def test_ase_forces_are_minus_the_double_hybrids_gradient(api_gradient):
    """DFMP2Calculator(method='B2PLYP') (any of its names): forces = -dfmp2.gradient's gradient in
    eV/Å (Hartree/Bohr of ase.units), energy its total in eV."""
    pytest.importorskip("ase")
    from ase.io import read
    from ase.units import Bohr, Hartree

    from dfmp2.ase import DFMP2Calculator

    atoms = read(str(WATER))
    atoms.calc = DFMP2Calculator(method="B2PLYP", basis="sto-3g", dft_grid=GRID)
    forces = atoms.get_forces()
    g = api_gradient.gradient
    assert api_gradient.method == "b2plyp" and api_gradient.result.double_hybrid is not None
    assert np.abs(forces + g * Hartree / Bohr).max() < 1e-6  # eV/Å: ASE's Bohr is CODATA 2014's, PySCF's 2018's
    assert np.abs(g).max() > 1e-2  # the input geometry is not B2PLYP/STO-3G's minimum
    assert atoms.get_potential_energy() == pytest.approx(api_gradient.energy * Hartree, abs=1e-6)


def _atomic_input(driver: str, method: str = "b2plyp", **extra) -> dict:
    geom = read_xyz(WATER)
    return {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "id": "dh-water-1",
        "driver": driver,
        "model": {"method": method, "basis": "sto-3g"},
        "molecule": {"symbols": list(geom.symbols), "geometry": (geom.coords_angstrom / BOHR).ravel().tolist()},
        "keywords": {},
        **extra,
    }


def test_qcschema_gradient_driver_returns_the_double_hybrids_gradient(api_gradient):
    """driver 'gradient', model.method 'b2plyp': return_result and return_gradient are
    dfmp2.gradient's (Eh/bohr), the result keeps the input's id, Psi4's names CURRENT GRADIENT and
    DFT TOTAL GRADIENT carry it, return_energy its total."""
    qcschema = pytest.importorskip("dfmp2.interfaces.qcschema")
    pytest.importorskip("qcelemental")
    out = qcschema.run_qcschema(_atomic_input("gradient"), RunOptions(dft_grid=GRID))
    d = json.loads(qcschema.to_json(out))
    g = api_gradient.gradient
    assert d["id"] == "dh-water-1" and d["success"] and d["driver"] == "gradient"
    assert np.abs(np.reshape(d["return_result"], (3, 3)) - g).max() < 1e-8
    assert np.abs(np.reshape(d["properties"]["return_gradient"], (3, 3)) - g).max() < 1e-8
    qv = d["extras"]["qcvars"]
    assert np.array_equal(qv["CURRENT GRADIENT"], qv["DFT TOTAL GRADIENT"])
    assert np.array_equal(np.reshape(qv["CURRENT GRADIENT"], (3, 3)), np.reshape(d["return_result"], (3, 3)))
    assert d["properties"]["return_energy"] == pytest.approx(api_gradient.energy, abs=1e-8)
    assert d["extras"]["dfmp2"]["gradient"]["double_hybrid"]["functional"] == "B2PLYP"


def test_frequencies_of_a_closed_shell_double_hybrid_compute_ir_intensities():
    """A closed-shell double hybrid's relaxed dipole exists (dfmp2.grad.dh.dh_densities): the
    frequencies ask each displaced gradient for it; the evaluations' properties carry the
    dipole. Rows from a stand-in (no gradient run)."""
    geom = read_xyz(WATER)
    k = 0.5 * np.eye(9)  # a stand-in Hessian (Eh/bohr²): g(x) = k (x - x0); dipole d(x) = x

    def evaluate(g, world):
        dx = (np.asarray(g.coords_angstrom) - geom.coords_angstrom).ravel() / BOHR
        return [-76.0, *(k @ dx), *dx[:3]], None

    res = F.frequencies(geom, RunOptions(basis="sto-3g"), "B2PLYP", evaluate=evaluate)
    assert res.method == "b2plyp" and res.ir is not None
    assert not any("IR intensities" in w for w in res.warnings)


def _energy_frequencies(geom, options, step):
    """Harmonic frequencies (cm⁻¹) of the Hessian from second differences of our energies at
    ``step`` (hessian_fd), analysed as the workflow analyses its own (projection, masses)."""
    H = energy_hessian(geom, options, options.method, step)
    mol = molecule.build_molecule(geom, options.basis, None, None)
    return np.asarray(F.harmonic(F.analysis_molecule(mol)[0], H)["freq_wavenumber"]), H


@pytest.mark.heavy
def test_b2plyp_water_optimises_and_its_frequencies_match_energy_second_differences(tmp_path):
    """B2PLYP water/STO-3G (default grid, level 3): dfmp2 optimize converges from the shipped
    geometry; at its geometry dfmp2 frequencies (central differences of analytic gradients, step
    5e-3 bohr) gives three real modes, each within 1 cm⁻¹ of the frequencies of a Hessian from
    second differences of our B2PLYP energies (the same step, the same projection and masses)."""
    opts = fd_options(basis="sto-3g", method="b2plyp")
    final = tmp_path / "w.opt.xyz"
    r = CliRunner().invoke(
        main,
        ["optimize", str(WATER), "--basis", "sto-3g", "--method", "b2plyp", "-o", str(final), "--scf-conv-tol-grad",
         "1e-10", "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "converged in" in r.output and "E(B2PLYP)" in final.read_text()
    out = tmp_path / "f.json"
    r = CliRunner().invoke(
        main,
        ["frequencies", str(final), "--basis", "sto-3g", "--method", "b2plyp", "--step", "0.005", "--json", str(out),
         "--scf-conv-tol-grad", "1e-10", "-q"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["method"] == "b2plyp" and d["vibrational_modes"] == 3 and d["imaginary_modes"] == 0
    assert d["max_abs_gradient"] < 3e-4 and len(d["ir_intensities"]) == 3  # from the relaxed dipole
    assert all(i >= 0 for i in d["ir_intensities"]) and max(d["ir_intensities"]) > 1.0
    freq = np.asarray(d["frequencies"])
    assert (freq > 1000).all()
    ref, _ = _energy_frequencies(read_xyz(final), opts, 0.005)
    assert np.abs(freq - ref).max() <= 1.0, (freq, ref)
