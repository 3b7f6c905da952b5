"""Frequencies' inputs refused in one line before any evaluation: the thermochemistry's temperature
and pressure (finite, physical), the checkpoint file (a regular file of sane size whose rows are
real finite numbers), and the Python API's keyword types."""

import json
import math
import os
import re
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F

WATER = Path(__file__).resolve().parents[2] / "inputs" / "water.xyz"


def _never(*a, **k):
    raise AssertionError("no evaluation may run")


@pytest.mark.parametrize(
    "flag,value,says",
    [
        ("--temperature", "inf", "temperature"),
        ("--temperature", "nan", "temperature"),
        ("--temperature", "1e300", "temperature"),
        ("--pressure", "1e-300", "pressure"),
        ("--pressure", "inf", "pressure"),
        ("--pressure", "nan", "pressure"),
    ],
)
def test_temperature_and_pressure_out_of_range_are_refused(tmp_path, monkeypatch, flag, value, says):
    monkeypatch.setattr(F, "evaluate_gradient", _never)
    out = tmp_path / "f.json"
    r = CliRunner().invoke(main, ["frequencies", str(WATER), "-q", flag, value, "--json", str(out)])
    assert_one_line_error(r, says, flag)
    assert not out.exists()


def test_thermochemistry_at_the_bounds_is_finite_json():
    """At the bounds of TEMPERATURE_K and PRESSURE_PA every thermochemistry number is finite."""
    import numpy as np
    from pyscf import gto

    from dfmp2.io.outputs import json_text

    mol = gto.M(atom="O 0 0 0.117; H 0 0.757 -0.467; H 0 -0.757 -0.467", basis="sto-3g")
    freq = np.array([20.0, 1663.0, 3833.0]) / 219474.63
    for t in F.TEMPERATURE_K:
        for p in F.PRESSURE_PA:
            th = F.thermochemistry(mol, -76.0, freq, t, p, 2)
            json_text(json.loads(json.dumps(th, default=lambda x: np.asarray(x).tolist())))


def test_json_writers_refuse_nan(tmp_path):
    from dfmp2.io.outputs import json_text, write_json

    with pytest.raises(InputError, match=r"thermo\.S\[1\] is not a finite number"):
        json_text({"thermo": {"S": [1.0, math.nan]}})
    with pytest.raises(InputError, match=r"x\.json"):
        write_json(tmp_path / "x.json", {"e": math.inf})
    assert not (tmp_path / "x.json").exists()


def test_api_temperature_refused():
    with pytest.raises(InputError, match="temperature"):
        F.frequencies(read_xyz(WATER), RunOptions(basis="sto-3g"), temperature=math.inf, evaluate=_never)


# ------------------------------------------------------------------ the checkpoint file and its rows
OPTS = RunOptions(basis="sto-3g")
NTASK, WIDTH = 18, 13  # water: 6N evaluations, rows [E, g (9), μ (3)]


def _fp():
    return F.fingerprint(read_xyz(WATER), OPTS, "mp2", F.STEP_BOHR)


def _good_rows():
    return {k: [-75.0 + 1e-3 * k, *([0.01] * 9), 0.1, 0.2, 0.3] for k in range(4)}


def _loads_within(path, seconds=10.0):
    """load_checkpoint in a thread: (finished, the exception it raised or None)."""
    import threading

    box = []

    def target():
        try:
            F.load_checkpoint(path, _fp(), NTASK, WIDTH)
            box.append(None)
        except Exception as e:
            box.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), (box[0] if box else None)


def test_checkpoint_rows_round_trip_with_and_without_dipoles(tmp_path):
    ck = tmp_path / "ck.json"
    rows = _good_rows()
    rows[2] = [*rows[2][:10], math.nan, math.nan, math.nan]  # no dipole (ir off): null in the file
    F.save_checkpoint(ck, _fp(), rows)
    assert "NaN" not in ck.read_text()
    back = F.load_checkpoint(ck, _fp(), NTASK, WIDTH)
    assert back[1] == rows[1] and all(math.isnan(x) for x in back[2][10:]) and back[2][:10] == rows[2][:10]


@pytest.mark.parametrize(
    "entry,value,says",
    [
        (0, "NaN", "entry 0 is NaN, expected a finite number"),
        (0, "1e300", "beyond"),
        (3, "true", "entry 3 is true, expected a number"),
        (3, '"1.5"', "expected a number"),
        (11, "null", "expected a number"),  # one dipole component absent, the others not
        (4, "Infinity", "expected a finite number"),
    ],
)
def test_damaged_checkpoint_rows_are_refused(tmp_path, monkeypatch, entry, value, says):
    ck = tmp_path / "ck.json"
    F.save_checkpoint(ck, _fp(), _good_rows())
    doc = json.loads(ck.read_text())
    row = [json.dumps(x) for x in doc["tasks"]["1"]]
    row[entry] = value
    text = json.dumps(doc).replace(json.dumps(doc["tasks"]["1"]), "[" + ", ".join(row) + "]")
    ck.write_text(text)
    with pytest.raises(InputError, match="task 1") as e:
        F.load_checkpoint(ck, _fp(), NTASK, WIDTH)
    assert str(ck) in str(e.value) and says in str(e.value)
    monkeypatch.setattr(F, "evaluate_gradient", _never)
    r = CliRunner().invoke(main, ["frequencies", str(WATER), "-q", "--basis", "sto-3g", "--checkpoint", str(ck)])
    assert_one_line_error(r, str(ck), "task 1", "(--checkpoint)")


@pytest.mark.parametrize("tasks", ['{"1": [1, 2]}', '{"x": []}', '{"99": []}', "[]"])
def test_checkpoint_of_another_shape_is_refused(tmp_path, tasks):
    ck = tmp_path / "ck.json"
    ck.write_text(f'{{"kind": "{F.CHECKPOINT_KIND}", "fingerprint": {{}}, "tasks": {tasks}}}')
    with pytest.raises(InputError, match=re.escape(str(ck))):
        F.load_checkpoint(ck, _fp(), NTASK, WIDTH)


def test_checkpoint_that_is_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    fifo = tmp_path / "ck.fifo"
    os.mkfifo(fifo)
    for path, says in ((fifo, "is a FIFO"), (Path("/dev/zero"), "character device")):
        done, err = _loads_within(path)
        assert done, f"reading {path} did not end"
        assert isinstance(err, InputError) and says in str(err) and "not a regular file" in str(err), err


def test_checkpoint_larger_than_its_rows_take_is_refused(tmp_path):
    ck = tmp_path / "ck.json"
    with open(ck, "wb") as f:  # sparse: nothing is written
        f.truncate(F.CHECKPOINT_MARGIN_BYTES + F.CHECKPOINT_BYTES_PER_NUMBER * NTASK * WIDTH + 1)
    with pytest.raises(InputError, match="more than this job's checkpoint takes"):
        F.load_checkpoint(ck, _fp(), NTASK, WIDTH)


# ------------------------------------------------------------------ dfmp2.frequencies' keywords
@pytest.mark.parametrize(
    "kw,says",
    [
        (dict(ir="no"), "ir must be True or False, got 'no'"),
        (dict(ir=1), "ir must be True or False"),
        (dict(step="0.01"), "the step must be between 1e-5 and 0.1 bohr, got '0.01'"),
        (dict(step=True), "the step must be"),
        (dict(temperature="300"), "the temperature must be a number"),
        (dict(pressure=None), "the pressure must be a number"),
        (dict(checkpoint=3), "checkpoint must be a path"),
        (dict(symmetry_number=2.0), "symmetry number must be a positive integer"),
        (dict(method=2), "method must be a method name"),
    ],
)
def test_api_keywords_of_another_type_are_one_input_error(monkeypatch, kw, says):
    import dfmp2

    monkeypatch.setattr(F, "evaluate_gradient", _never)
    with pytest.raises(InputError) as e:
        dfmp2.frequencies(str(WATER), basis="sto-3g", **kw)
    assert says in str(e.value)
