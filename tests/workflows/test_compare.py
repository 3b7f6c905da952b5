"""``dfmp2 compare``: devices compared from identical inputs, bits checked, devices that cannot run
reported as not run (never filled from another device), exit codes."""

import json
from pathlib import Path

import pytest
import torch
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.workflows.compare import DeviceRun, compare_runs, parse_synthetic

ROOT = Path(__file__).resolve().parents[2]
WATER = str(ROOT / "inputs" / "water.xyz")


def _invoke(args, tmp_path=None):
    res = CliRunner().invoke(main, ["compare", *args])
    doc = None
    if tmp_path is not None and (tmp_path / "c.json").exists():
        doc = json.loads((tmp_path / "c.json").read_text())
    return res, doc


def test_synthetic_cpu_is_bit_identical_run_to_run(tmp_path):
    res, doc = _invoke(
        [
            "--synthetic",
            "5,24,40",
            "--seed",
            "4",
            "--devices",
            "cpu",
            "--repeat",
            "3",
            "--json",
            str(tmp_path / "c.json"),
        ],
        tmp_path,
    )
    assert res.exit_code == 0, res.output
    (cpu,) = doc["devices"]
    assert cpu["status"] == "ran" and len(cpu["hex"]) == 3 and cpu["repeat_identical"]
    assert len({json.dumps(h, sort_keys=True) for h in cpu["hex"]}) == 1
    assert cpu["hex"][0]["e_corr"] == float.hex(cpu["energies"]["e_corr"])
    assert doc["summary"]["passed"] and doc["problem"]["synthetic"]["nocc"] == 5


def test_synthetic_cpu_vs_trn1_emulator_fp32(tmp_path):
    """Two devices that both run here: the differences are reported, bits compared."""
    res, doc = _invoke(
        [
            "--synthetic",
            "4,20,30",
            "--devices",
            "cpu,trn1",
            "--simulate",
            "--precision",
            "fp32",
            "--json",
            str(tmp_path / "c.json"),
        ],
        tmp_path,
    )
    assert res.exit_code == 0, res.output
    cpu, trn = doc["devices"]
    assert trn["ran"]["device"] == "trn1" and {"op": "mp2_pair_energy", "kernel": "nki.mp2_pair"} in [
        {k: x[k] for k in ("op", "kernel")} for x in trn["ran"]["kernels"]
    ]
    assert abs(trn["delta"]["e_corr"]) <= 1e-6 and cpu["delta"]["e_corr"] == 0.0
    assert trn["identical_to_first"] == (trn["hex"][0] == cpu["hex"][0])


def test_molecule_cpu_and_a_precision_a_device_never_runs(tmp_path, no_scf):
    """trn1 in fp64 cannot run anywhere: refused in one line before any device runs (it used to
    be reported after the CPU's whole run); nothing is written."""
    out = tmp_path / "c.json"
    res, doc = _invoke([WATER, "--devices", "cpu,trn1", "--json", str(out)], tmp_path)
    assert_one_line_error(res, "trn1: ", "no fp64", "compare every device in fp32", "(--precision)")
    assert doc is None and not out.exists()


def test_cuda_without_gpu_is_not_run_with_reason(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU, on any machine
    res, doc = _invoke(
        ["--synthetic", "3,10,12", "--devices", "cpu,cuda", "--json", str(tmp_path / "c.json")], tmp_path
    )
    assert res.exit_code == 2
    cuda = doc["devices"][1]
    assert cuda["device"] == "cuda" and cuda["status"] == "not run" and "CUDA" in cuda["reason"]
    assert cuda["energies"] == {}


@pytest.mark.parametrize(
    "args,msg",
    [
        ([], "either an XYZ file or --synthetic"),
        ([WATER, "--synthetic", "2,3,4"], "either an XYZ file or --synthetic"),
        (["--synthetic", "2,3"], "NOCC,NVIR,NAUX"),
        (["--synthetic", "2,0,4"], "positive"),
        (["--synthetic", "2,3,4", "--devices", "cpu,cpu"], "listed twice"),
        (["--synthetic", "2,3,4", "--devices", "cpu,tpu"], "unknown device"),
        (["--synthetic", "2,3,4", "--tol", "0"], "--tol"),
        (["missing.xyz", "--devices", "cpu"], "missing.xyz"),
    ],
)
def test_bad_input_is_one_error_line(args, msg):
    res, _ = _invoke(args)
    assert res.exit_code == 2
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error:") and msg in res.output
    assert "Traceback" not in res.output


def _run(device, e_corr_hex_list, e_corr=-0.2):
    r = DeviceRun(device)
    r.energies = {"e_os": e_corr, "e_ss": 0.0, "e_corr": e_corr}
    r.hex = [{"e_os": h, "e_ss": "0x0.0p+0", "e_corr": h} for h in e_corr_hex_list]
    r.seconds = [0.0] * len(e_corr_hex_list)
    return r


def test_compare_runs_flags_differences():
    a = _run("cpu", [float.hex(-0.2)] * 2)
    b = _run("cuda", [float.hex(-0.2 + 1e-12)] * 2, -0.2 + 1e-12)
    c = _run("trn1", [float.hex(-0.2), float.hex(-0.2 + 1e-16)], -0.2 + 1e-9)
    s = compare_runs([a, b, c, DeviceRun("trn2", status="not run", reason="no SDK")], tol=1e-10)
    assert s["reference_device"] == "cpu" and a.identical_to_first and not b.identical_to_first
    assert abs(b.delta["e_corr"] - 1e-12) < 1e-15 and b.repeat_identical
    assert s["beyond_tolerance"] == ["trn1"] and s["not_bit_reproducible"] == ["trn1"]
    assert s["not_run"] == ["trn2"] and not s["passed"]


def test_parse_synthetic_forms():
    assert parse_synthetic("8,60,150") == parse_synthetic("8x60x150") == (8, 60, 150)


def test_default_devices_are_the_ones_present(tmp_path):
    """No --devices: cpu plus what is present here; the output and the JSON say what was left out
    and why, and a machine without a GPU is not an error."""
    from dfmp2.linalg import present_devices

    present, absent = present_devices("fp64")
    assert present[0] == "cpu" and ("cuda" in present) == torch.cuda.is_available()
    assert "trn1" in absent and "trn2" in absent and "no fp64" not in absent.get("cuda", "")
    res, doc = _invoke(["--synthetic", "3,10,12", "--json", str(tmp_path / "c.json")], tmp_path)
    assert res.exit_code == 0, res.output
    assert [d["device"] for d in doc["devices"]] == present
    assert all(d["status"] == "ran" for d in doc["devices"]) and doc["summary"]["passed"]
    assert doc["devices_requested"] == "present (default)" and doc["devices_not_present"] == absent
    assert "(present here)" in res.output and "not present" in res.output and "trn1" in res.output
    if not torch.cuda.is_available():
        assert "cuda (no CUDA GPU" in res.output


def test_explicit_devices_are_still_required(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # no GPU, on any machine
    res, doc = _invoke(
        ["--synthetic", "3,10,12", "--devices", "cpu,cuda", "--json", str(tmp_path / "c.json")], tmp_path
    )
    assert res.exit_code == 2 and doc["summary"]["not_run"] == ["cuda"]
    assert doc["devices_requested"] == "cpu,cuda" and "present here" not in res.output
    # the reason is in the error line on stderr, not only in the table on stdout
    assert res.output.strip().splitlines()[-1].startswith("error: not run: cuda (")


def test_synthetic_beyond_memory_is_refused_before_allocating(monkeypatch):
    from dfmp2 import linalg
    from dfmp2.memory import synthetic_memory_mb

    def no_alloc(*a, **k):
        raise AssertionError("synthetic_problem must not run")

    monkeypatch.setattr(linalg, "synthetic_problem", no_alloc)
    res, _ = _invoke(["--synthetic", "100000,100000,100000", "--devices", "cpu"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.startswith("error:")]
    assert "needs about 8 PB on host" in line and "B is available" in line
    need = synthetic_memory_mb(2, 10, 30, 8)
    assert need["b"] == 2 * 10 * 30 * 8 / 1e6 and need["pair"] > need["b"]


@pytest.mark.parametrize(
    "args,msg",
    [
        (["--synthetic", "2,3,4", "--devices", "cpu", "--tol", "inf"], "finite"),
        (["--synthetic", "2,3,4", "--devices", "cpu", "--tol", "nan"], "finite"),
        (["--synthetic", "2,3,4", "--devices", "cpu", "--seed", str(2**64)], "--seed"),
    ],
)
def test_bad_numbers_are_one_error_line(args, msg):
    res, _ = _invoke(args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and msg in lines[0], res.output


def test_verdict_when_no_device_ran(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    res, _ = _invoke(["--synthetic", "3,10,12", "--devices", "cuda"])
    assert res.exit_code == 2 and "(no device ran)" in res.output and "against None" not in res.output
