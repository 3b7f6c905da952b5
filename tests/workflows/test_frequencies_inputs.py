"""Frequencies' inputs refused in one line before any evaluation: the thermochemistry's temperature
and pressure (finite, physical), the checkpoint file (a regular file of sane size whose rows are
real finite numbers), and the Python API's keyword types."""

import json
import math
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
