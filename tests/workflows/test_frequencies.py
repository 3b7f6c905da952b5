"""``dfmp2 frequencies`` (dfmp2.workflows.frequencies): the Hessian from central differences of
analytic gradients against second differences of our energies (an independent route: energies
only), the checkpoint (resume computes only what is missing, to the same bits; another job's
checkpoint refused), the outputs, and bad input as one error line."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.errors import SCFNotConvergedError
from dfmp2.interfaces.api import run
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
OPTIONS = RunOptions(basis="def2-svp")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def water(tmp_path_factory):
    """Water/def2-SVP frequencies (and IR intensities) at the input geometry, with a checkpoint
    (every evaluation's row)."""
    ck = tmp_path_factory.mktemp("freq") / "ck.json"
    return F.frequencies(read_xyz(WATER), OPTIONS, checkpoint=ck), ck


@pytest.mark.heavy
def test_hessian_against_second_differences_of_energies(water):
    """v^T H v along random unit directions equals (E(x + tv) - 2E(x) + E(x - tv)) / t² of our
    energies to 1e-4 Eh/bohr² (the second difference's own truncation error is ~1e-5 at t = 0.01
    bohr); the translations and rotations are projected out: 3 modes for water, and E and g at the
    reference are the run's."""
    res, _ = water
    geom = read_xyz(WATER)
    e0 = run(geom, OPTIONS)
    assert res.energy == pytest.approx(e0.e_hf + e0.e_corr, abs=1e-10)
    rng = np.random.default_rng(7)
    t = 0.01
    for _ in range(2):
        v = rng.normal(size=3 * geom.natm)
        v /= np.linalg.norm(v)
        shifted = [
            dataclasses.replace(geom, coords_angstrom=geom.coords_angstrom + s * t * F.BOHR * v.reshape(-1, 3))
            for s in (1, -1)
        ]
        ep, em = (run(g, OPTIONS) for g in shifted)
        d2 = ((ep.e_hf + ep.e_corr) - 2 * res.energy + (em.e_hf + em.e_corr)) / t**2
        assert float(v @ res.hessian @ v) == pytest.approx(d2, abs=1e-4)
    assert res.frequencies.shape == (3,) and (res.frequencies > 1000).all()
    assert np.allclose(res.hessian, res.hessian.T)
    assert res.point_group == "C2v" and res.thermo["sym_number"][0] == 2
    assert res.zero_modes["projected"].shape == res.zero_modes["unprojected"].shape == (6,)
    assert res.tasks == {"evaluations": 19, "resumed": 0, "computed": 19, "ranks": 1}


@pytest.mark.heavy
def test_ir_intensities_against_ase_infrared(tmp_path):
    """At the optimised geometry: the zero modes of the unprojected Hessian are below 10 cm⁻¹, and
    the frequencies and IR intensities equal ASE's Infrared (its own finite differences, step
    0.005 Å ≈ 0.0094 bohr, and its own km/mol conversion) over our ASE calculator's forces and
    relaxed dipoles, to 1 % (intensities) and 1 cm⁻¹ (frequencies)."""
    from ase import Atoms
    from ase.vibrations import Infrared

    from dfmp2.ase import DFMP2Calculator
    from dfmp2.workflows.optimize import optimize

    geom = optimize(read_xyz(WATER), OPTIONS).geometry
    res = F.frequencies(geom, OPTIONS)
    assert res.ir is not None and (res.ir > 0).all()
    assert np.abs(res.zero_modes["projected"]).max() < 10  # the six projected out: zero to rounding
    assert (
        np.sort(np.abs(res.zero_modes["unprojected"]))[:3].max() < 1
    )  # translations: a translation-invariant gradient
    atoms = Atoms(list(geom.symbols), positions=geom.coords_angstrom)
    atoms.calc = DFMP2Calculator(basis="def2-svp")
    ir = Infrared(atoms, name=str(tmp_path / "ir"), delta=0.005)  # Å: 0.0094 bohr, against our 0.005 bohr
    ir.run()
    order = np.argsort(np.real(ir.get_frequencies()))[-3:]  # the three vibrations (the others near zero)
    theirs_f = np.real(ir.get_frequencies())[order]
    theirs_i = ir.intensities[order] * ir.intensity_prefactor("km/mol")[0]  # (D/Å)²/amu -> km/mol
    assert np.allclose(res.frequencies, theirs_f, rtol=0, atol=1.0)
    assert np.allclose(res.ir, theirs_i, rtol=0.01, atol=0.05)


def _replay(ck: Path):
    """A stand-in evaluation that returns the checkpoint's row of the displaced geometry, counted."""
    rows = {int(k): v for k, v in json.loads(ck.read_text())["tasks"].items()}
    geom = read_xyz(WATER)
    where = {
        F.displaced(geom, c, s, F.STEP_BOHR).coords_angstrom.tobytes(): k for k, (c, s) in enumerate(F.tasks_of(3))
    }
    calls = []

    def evaluate(g, world):
        assert not world.distributed  # each evaluation runs in one process
        k = where[np.asarray(g.coords_angstrom).tobytes()]
        calls.append(k)
        return rows[k], None

    return evaluate, calls


@pytest.mark.heavy
def test_an_interrupted_job_resumes_without_recomputing(water, tmp_path):
    """Stopped after 5 evaluations, the checkpoint holds those 5; the next run computes the 14
    others only, and its Hessian and frequencies are bitwise the uninterrupted run's."""
    res, full_ck = water
    evaluate, calls = _replay(full_ck)
    ck = tmp_path / "ck.json"

    def stop_after_five(g, world):
        if len(calls) == 5:
            raise KeyboardInterrupt
        return evaluate(g, world)

    with pytest.raises(KeyboardInterrupt):
        F.frequencies(read_xyz(WATER), OPTIONS, checkpoint=ck, evaluate=stop_after_five)
    assert sorted(json.loads(ck.read_text())["tasks"]) == ["0", "1", "2", "3", "4"]
    calls.clear()
    again = F.frequencies(read_xyz(WATER), OPTIONS, checkpoint=ck, evaluate=evaluate)
    assert sorted(calls) == list(range(5, 19))
    assert again.tasks["resumed"] == 5 and again.tasks["computed"] == 14
    assert np.array_equal(again.hessian, res.hessian) and np.array_equal(again.frequencies, res.frequencies)


def test_another_job_s_checkpoint_is_refused(water, tmp_path):
    _, ck = water
    with pytest.raises(F.FrequencyError, match="step_bohr differ"):
        F.frequencies(read_xyz(WATER), OPTIONS, step=0.01, checkpoint=ck)
    with pytest.raises(F.FrequencyError, match="basis"):
        F.frequencies(read_xyz(WATER), RunOptions(basis="cc-pvdz"), checkpoint=ck)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(F.FrequencyError, match="not a dfmp2 frequency checkpoint"):
        F.frequencies(read_xyz(WATER), OPTIONS, checkpoint=bad)


def test_cli_outputs(water, tmp_path, monkeypatch):
    """The CLI's tables, --json (units, the modes, thermochemistry) and --molden (the sections a
    viewer reads), from the checkpoint (nothing recomputed)."""
    res, ck = water
    evaluate, _calls = _replay(ck)
    monkeypatch.setattr(F, "evaluate_gradient", lambda g, o, m, w, p=None, log=None: evaluate(g, w))
    out, mold = tmp_path / "f.json", tmp_path / "f.molden"
    r = CliRunner().invoke(
        main, ["frequencies", str(WATER), "--basis", "def2-svp", "-q", "--json", str(out), "--molden", str(mold)]
    )
    assert r.exit_code == 0, r.output
    assert "harmonic frequencies" in r.stdout and "zero-point energy" in r.stdout and "C2v" in r.stdout
    d = json.loads(out.read_text())
    assert d["schema"] == F.SCHEMA and d["units"]["frequencies"].startswith("cm^-1")
    assert np.allclose(d["frequencies"], res.frequencies, rtol=0, atol=1e-9)
    assert np.array(d["normal_modes"]).shape == (3, 3, 3) and d["thermo"]["ZPE"] > 0.02
    assert d["finite_differences"]["step_bohr"] == F.STEP_BOHR and d["warnings"]  # not a stationary point
    text = mold.read_text()
    for section in ("[Molden Format]", "[FREQ]", "[FR-COORD]", "[FR-NORM-COORD]", "vibration 3"):
        assert section in text


@pytest.mark.parametrize("xyz,message", [("1\n\nNe 0 0 0\n", "a single atom has no vibrational modes")], ids=["atom"])
def test_molecules_without_modes_are_one_error_line(tmp_path, xyz, message):
    path = tmp_path / "m.xyz"
    path.write_text(xyz)
    r = CliRunner().invoke(main, ["frequencies", str(path), "-q"])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(err) == 1 and err[0].startswith("error:") and message in err[0]


def test_a_displacement_whose_scf_fails_is_one_error_line(tmp_path, monkeypatch):
    """The SCF of the fourth evaluation does not converge: one error line naming that displacement,
    exit 2, no JSON."""
    seen = []

    def evaluate(g, o, m, w, p=None, log=None):
        seen.append(1)
        if len(seen) == 4:
            raise SCFNotConvergedError("RHF did not converge in 100 cycles")
        return [0.0] * 13, None

    monkeypatch.setattr(F, "evaluate_gradient", evaluate)
    out = tmp_path / "f.json"
    r = CliRunner().invoke(main, ["frequencies", str(WATER), "-q", "--json", str(out)])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(err) == 1, r.output
    assert "at atom 1 (O) y +0.005 bohr" in err[0] and "did not converge" in err[0]
    assert not out.exists()
