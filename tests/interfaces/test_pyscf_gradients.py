"""PySCF's gradient conventions on the drop-in: ``DFMP2(mf).Gradients()`` is a
``pyscf.grad.rhf.GradientsBase``, so PySCF's optimiser (``pyscf.geomopt.geometric_solver``), its
``optimizer()`` route and its gradient scanner drive our DF-MP2 gradient. References: ``dfmp2
optimize`` (the CLI's own geomeTRIC loop over the same energy) for the optimised geometries, a
fresh gradient object at each geometry for the scanner."""

import io
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("geometric", reason="PySCF's geometric_solver needs geomeTRIC (the test extra has it)")

from pyscf import gto, scf
from pyscf.geomopt import geometric_solver
from pyscf.lib import GradScanner

import dfmp2
from dfmp2.io.xyz import read_xyz

WATER = [("O", (0, 0, 0)), ("H", (0, 0.952627944, 0.55)), ("H", (0, -0.952627944, 0.55))]  # OH 1.1 Å, 120°
OH = [("O", (0, 0, 0)), ("H", (0, 0, 1.05))]
TIGHT = "GAU_VERYTIGHT"  # geomeTRIC's: max |g| 2e-6 Eh/bohr, max step 6e-6 Å: both runs land within 1e-5 Å


def _distances(c):
    c = np.asarray(c)
    return np.array([np.linalg.norm(c[i] - c[j]) for i in range(len(c)) for j in range(i)])


def _mf(atoms, spin=0, basis="cc-pvdz"):
    mol = gto.M(atom=atoms, basis=basis, spin=spin, verbose=0)
    jk = f"{basis}-jkfit" if basis.startswith("cc-") else None  # else PySCF's choice (def2-universal-jkfit)
    mf = (scf.UHF(mol) if spin else scf.RHF(mol)).density_fit(auxbasis=jk)
    mf.conv_tol = 1e-12
    return mf


def _cli_optimum(tmp_path, atoms, mult):
    src = tmp_path / "in.xyz"
    src.write_text(f"{len(atoms)}\n\n" + "".join(f"{s} {x} {y} {z}\n" for s, (x, y, z) in atoms))
    final = tmp_path / "in.opt.xyz"
    cmd = [sys.executable, "-m", "dfmp2", "optimize", str(src), "--basis", "cc-pvdz", "--multiplicity", str(mult)]
    cmd += ["--convergence", TIGHT.lower(), "--scf-conv-tol-grad", "1e-10", "-o", str(final)]
    cmd += ["--trajectory", str(tmp_path / "traj.xyz"), "-q"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return read_xyz(final).coords_angstrom


@pytest.mark.heavy
@pytest.mark.parametrize("atoms, spin", [(WATER, 0), (OH, 1)], ids=["water-rhf", "oh-uhf"])
def test_pyscf_geometric_solver_optimises_to_dfmp2_optimize(tmp_path, atoms, spin):
    """pyscf.geomopt.geometric_solver.optimize(DFMP2(mf)): the same minimum as `dfmp2 optimize`
    (the same JK-fit and MP2-fit sets), every interatomic distance within 1e-5 Å."""
    pt = dfmp2.DFMP2(_mf(atoms, spin), auxbasis="cc-pvdz-ri")
    mol = geometric_solver.optimize(pt, convergence_set=TIGHT)
    ours = _cli_optimum(tmp_path, atoms, spin + 1)
    assert np.abs(_distances(mol.atom_coords(unit="Angstrom")) - _distances(ours)).max() < 1e-5


def test_gradients_optimizer_route_and_table():
    """``DFMP2(mf).Gradients().optimizer(solver='geomeTRIC').kernel()`` (PySCF's second route)
    converges to the optimize() geometry, and the gradient prints PySCF's table at verbose 4."""
    pt = dfmp2.DFMP2(_mf(WATER, basis="sto-3g"))
    opt = pt.Gradients().optimizer(solver="geomeTRIC")
    opt.params = {"convergence_set": TIGHT}
    mol = opt.kernel()
    assert opt.converged
    ref = geometric_solver.optimize(dfmp2.DFMP2(_mf(WATER, basis="sto-3g")), convergence_set=TIGHT)
    assert np.abs(_distances(mol.atom_coords()) - _distances(ref.atom_coords())).max() < 1e-5 / 0.529
    g = dfmp2.DFMP2(_mf(WATER, basis="sto-3g").run()).Gradients()
    g.verbose, g.stdout = 4, io.StringIO()
    de = g.kernel()
    table = g.stdout.getvalue()
    assert "DFMP2 gradients" in table and "unit = Eh/Bohr" in table
    rows = [ln.split() for ln in table.splitlines() if ln.split()[:1] in (["0"], ["1"], ["2"])]
    np.testing.assert_allclose(np.array([r[2:] for r in rows], float), de, atol=1e-10)
    np.testing.assert_allclose(g.grad_elec() + g.grad_nuc(), de, atol=1e-12)


@pytest.mark.parametrize("spin", [0, 1], ids=["rhf", "uhf"])
def test_gradient_scanner_equals_fresh_gradients(spin):
    """``Gradients().as_scanner()`` at two geometries: (E, de) equal to a fresh DFMP2 gradient at
    each to 1e-8 (Hartree, Hartree/bohr); a GradScanner, converged, as PySCF's optimiser needs."""
    atoms = WATER if not spin else OH
    scanner = dfmp2.DFMP2(_mf(atoms, spin, "6-31g").run()).Gradients().as_scanner()
    assert isinstance(scanner, GradScanner) and scanner.as_scanner() is scanner
    for shift in (0.0, 0.03):
        moved = [(s, (x, y, z + (shift if i else 0))) for i, (s, (x, y, z)) in enumerate(atoms)]
        e, de = scanner(gto.M(atom=moved, basis="6-31g", spin=spin, verbose=0))
        assert scanner.converged
        fresh = dfmp2.DFMP2(_mf(moved, spin, "6-31g").run())
        de_ref = fresh.Gradients().kernel()
        assert abs(e - fresh.e_tot) < 1e-8
        np.testing.assert_allclose(de, de_ref, atol=1e-8)
