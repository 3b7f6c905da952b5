"""The rotational symmetry number σ of ``dfmp2 frequencies``' thermochemistry at an optimised
geometry: ``dfmp2 optimize`` leaves a molecule symmetric only to its convergence, where PySCF's
``detect_symm`` at its own 1e-5 bohr tolerance calls water Cs and ammonia C1 (σ 1). The reference
σ is the point group's (C2v: 2, C3v: 3; the rotational symmetry number table, CCCBDB), not our
code's; its effect on G(T) is +RT ln σ (the rotational partition function's 1/σ)."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from pyscf import symm
from pyscf.data import nist

from dfmp2.cli.main import main
from dfmp2.io.xyz import Geometry, read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# dfmp2 optimize --basis sto-3g (default convergence) from distorted starts: water from O (0, 0, 0.119),
# H (0.02, 0.77, -0.47), H (-0.01, -0.75, -0.49); ammonia from N (0, 0, 0.1165), H (0.01, 0.95, -0.27),
# H (0.81, -0.46, -0.28), H (-0.82, -0.47, -0.265) (Å). Both converged in 5 steps.
WATER_OPT = (
    ("O", "H", "H"),
    [
        [-0.0003664290, 0.0005559138, 0.1660883470],
        [0.0201875435, 0.7701561777, -0.4930095920],
        [-0.0098211145, -0.7507120915, -0.5140787550],
    ],
)
AMMONIA_OPT = (
    ("N", "H", "H", "H"),
    [
        [0.0029495711, 0.0038379432, 0.1861125133],
        [0.0012316567, 0.9469737043, -0.2917596345],
        [0.8133118730, -0.4671576186, -0.3032529683],
        [-0.8174931009, -0.4636540289, -0.2895999106],
    ],
)
OPTIONS = RunOptions(basis="sto-3g")
RT = nist.BOLTZMANN * 298.15 / nist.HARTREE2J  # Eh


def geometry(case) -> Geometry:
    return Geometry(tuple(case[0]), np.array(case[1]), charge=0, multiplicity=1)


def springs(geom: Geometry):
    """A stand-in for the gradient evaluations: springs of 0.5 Eh/bohr² between every pair of atoms
    at the reference geometry (invariant under translation and rotation; its own symmetry is the
    molecule's), E and the gradient of the displaced geometry, no dipole."""
    x0 = np.asarray(geom.coords_angstrom) / F.BOHR
    n = 3 * geom.natm
    K = np.zeros((n, n))
    for i in range(geom.natm):
        for j in range(i):
            u = (x0[i] - x0[j]) / np.linalg.norm(x0[i] - x0[j])
            b = 0.5 * np.outer(u, u)
            for a, c, s in ((i, i, 1), (j, j, 1), (i, j, -1), (j, i, -1)):
                K[3 * a : 3 * a + 3, 3 * c : 3 * c + 3] += s * b

    def evaluate(g, world):
        d = (np.asarray(g.coords_angstrom) / F.BOHR - x0).ravel()
        return [0.5 * d @ K @ d, *(K @ d), math.nan, math.nan, math.nan], None

    return evaluate


@pytest.mark.parametrize("case,group,sigma", [(WATER_OPT, "C2v", 2), (AMMONIA_OPT, "C3v", 3)], ids=["water", "ammonia"])
def test_an_optimised_geometry_gets_its_point_group_s_symmetry_number(case, group, sigma):
    """PySCF's own tolerance misses the symmetry (the finding); ours finds the group, σ is the
    table's, and G(T) with the detected σ is RT ln σ above the one with σ = 1 given."""
    geom = geometry(case)
    mol = F.io_molecule.build_molecule(geom, "sto-3g")
    assert symm.detect_symm(mol._atom)[0] in ("Cs", "C1")  # PySCF at 1e-5 bohr: σ 1
    res = F.frequencies(geom, OPTIONS, ir=False, evaluate=springs(geom))
    assert res.point_group == group and res.thermo["sym_number"][0] == sigma
    assert res.symmetry["symmetry_number"] == sigma and res.symmetry["tolerance_bohr"] == F.SYMMETRY_TOL_BOHR
    one = F.frequencies(geom, OPTIONS, ir=False, evaluate=springs(geom), symmetry_number=1)
    assert one.thermo["sym_number"][0] == 1 and one.symmetry["source"] == "given"
    dG = res.thermo["G_tot"][0] - one.thermo["G_tot"][0]
    assert dG == pytest.approx(RT * math.log(sigma), abs=1e-12)  # S_rot lower by R ln σ
    assert res.thermo["H_tot"][0] == pytest.approx(one.thermo["H_tot"][0], abs=1e-12)  # σ is entropy only


def test_the_cli_records_and_takes_the_symmetry_number(tmp_path, monkeypatch):
    """The JSON records the point group and σ with where σ came from; --symmetry-number sets it;
    a σ below 1 is one error line naming the option, exit 2."""
    geom = geometry(WATER_OPT)
    path = tmp_path / "w.opt.xyz"
    path.write_text("3\noptimised\n" + "\n".join(f"{s} {x:.10f} {y:.10f} {z:.10f}" for s, (x, y, z) in zip(*WATER_OPT)))
    evaluate = springs(read_xyz(path))
    monkeypatch.setattr(F, "evaluate_gradient", lambda g, o, m, w, p=None, log=None: evaluate(g, w))
    for extra, sigma, source in (([], 2, "detect_symm"), (["--symmetry-number", "1"], 1, "given")):
        out = tmp_path / f"f{sigma}.json"
        args = ["frequencies", str(path), "--basis", "sto-3g", "--no-ir", "-q", "--json", str(out), *extra]
        r = CliRunner().invoke(main, args)
        assert r.exit_code == 0, r.output
        d = json.loads(out.read_text())
        assert d["point_group"] == "C2v" and d["thermo"]["sym_number"] == sigma
        assert d["symmetry"]["symmetry_number"] == sigma and source in d["symmetry"]["source"]
        assert f"rotational symmetry number {sigma}" in r.stdout
    r = CliRunner().invoke(main, ["frequencies", str(path), "--symmetry-number", "0", "-q"])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(err) == 1 and "--symmetry-number" in err[0]
    with pytest.raises(F.FrequencyError, match="symmetry number") as e:
        F.frequencies(geom, OPTIONS, symmetry_number=0, evaluate=springs(geom))
    assert e.value.option == "symmetry_number"


@pytest.mark.heavy
def test_optimize_then_frequencies_of_water_use_sigma_2(tmp_path):
    """The whole route at sto-3g: dfmp2 optimize from the distorted start, then dfmp2 frequencies of
    its output: C2v, σ = 2 (the acceptance of issue 61)."""
    start = tmp_path / "w.xyz"
    start.write_text("3\ndistorted water\nO 0.0 0.0 0.119\nH 0.02 0.77 -0.47\nH -0.01 -0.75 -0.49\n")
    opt, out = tmp_path / "w.opt.xyz", tmp_path / "f.json"
    r = CliRunner().invoke(main, ["optimize", str(start), "--basis", "sto-3g", "-q", "-o", str(opt)])
    assert r.exit_code == 0, r.output
    args = ["frequencies", str(opt), "--basis", "sto-3g", "--no-ir", "-q", "--json", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["point_group"] == "C2v" and d["thermo"]["sym_number"] == 2
