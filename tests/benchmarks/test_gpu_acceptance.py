"""scripts/gpu_acceptance.py --dry-run: every step runs on the CPU with the smallest inputs, in its
own subprocess, and is recorded (pass, fail with the reason, or skipped with the reason); a step
that fails or hangs is recorded as failed and the others still run; the JSON and markdown are
whole and say on every line that matters that they are a dry run on the CPU, not GPU numbers;
nothing is written to scripts/results/. Without a GPU the real run refuses in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_acceptance.py"
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_acceptance

LABEL = "[DRY RUN ON CPU, NOT GPU NUMBERS]"


def _run(*args, timeout=600):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRITON_INTERPRET", None)
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout
    )


def _results(out):
    files = sorted(out.iterdir())
    assert [f.suffix for f in files] == [".json", ".md"] and all("DRY_RUN_CPU" in f.name for f in files)
    return json.loads(files[0].read_text()), files[1].read_text()


def test_dry_run_records_every_step_and_goes_on_after_a_failure(tmp_path):
    before = set((ROOT / "scripts" / "results").iterdir())
    p = _run("--dry-run", "--out-dir", str(tmp_path), "--fail-step", "ours_h2o_32")
    assert p.returncode == 1, p.stderr[-3000:]  # the injected failure
    assert "Traceback" not in p.stderr
    assert all(line.startswith(LABEL) for line in p.stdout.splitlines() if line)
    doc, md = _results(tmp_path)
    assert set((ROOT / "scripts" / "results").iterdir()) == before
    assert doc["meta"]["dry_run_cpu"] and "DRY RUN ON CPU" in doc["meta"]["gpu"]["name"]
    steps = {s["name"]: s for s in doc["steps"]}
    assert list(steps) == gpu_acceptance.steps_for()  # every step, in order
    for s in steps.values():
        assert s["status"] in ("pass", "fail", "skipped") and s["reason"] and s["seconds"] >= 0
    assert steps["ours_h2o_32"]["status"] == "fail" and "injected failure" in steps["ours_h2o_32"]["reason"]
    assert doc["failed"] == ["ours_h2o_32"] and doc["verdict"].startswith("FAIL")
    assert steps["cuda_tests"]["status"] == "skipped"  # no GPU: skipped, never passed
    assert steps["gpu4pyscf_h2o_16"]["status"] == "skipped"
    for name in ("pair_peak", "run_compare", "ours_h2o_16", "pyscf_h2o_16", "pyscf_h2o_32"):
        assert steps[name]["status"] == "pass", steps[name]
    assert steps["run_compare"]["result"]["compare"]["summary"]["passed"]
    base = steps["pyscf_h2o_16"]["result"]["baseline"]
    assert set(base["runs"]) == {"as_set", "unset"} and base["best"] in base["runs"]
    agree = {(a["molecule"], a["who"]): a for a in doc["checks"]["agreement"]}
    assert agree[("h2o_16", "ours")]["passed"] is True and agree[("h2o_16", "ours")]["abs_d_e_mp2"] < 1e-8
    assert agree[("h2o_32", "ours")]["passed"] is None  # ours failed there: not compared
    assert md.count("DRY RUN ON CPU, NOT GPU NUMBERS") >= 2 and md.rstrip().endswith(
        "**DRY RUN ON CPU, NOT GPU NUMBERS.**"
    )
    for name in steps:
        assert f"| {name} | {steps[name]['status']} |" in md


def test_a_step_over_its_budget_is_killed_and_recorded(tmp_path):
    p = _run(
        "--dry-run",
        "--out-dir",
        str(tmp_path),
        "--steps",
        "cuda_tests,run_compare",
        "--fail-step",
        "cuda_tests:hang",
        "--total-s",
        "12",
        timeout=300,
    )
    assert p.returncode == 1, p.stderr[-3000:]
    doc, _ = _results(tmp_path)
    steps = {s["name"]: s for s in doc["steps"]}
    assert steps["cuda_tests"]["status"] == "fail" and "over its budget" in steps["cuda_tests"]["reason"]
    assert steps["cuda_tests"]["seconds"] < 12
    assert steps["run_compare"]["status"] in ("pass", "fail") and "reason" in steps["run_compare"]


def test_real_run_without_gpu_refuses_in_one_line(tmp_path):
    p = _run("--out-dir", str(tmp_path), timeout=120)
    assert p.returncode != 0 and "no CUDA GPU" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_dry_run_of_the_torchrun_step_records_ranks_backend_and_energies(tmp_path):
    """The NCCL step's dry run: torchrun with 2 gloo ranks on the CPU (STO-3G water) against one
    process; the record holds the world size, the comm backend, both runs' energies and their
    differences, and the markdown its table."""
    p = _run("--dry-run", "--out-dir", str(tmp_path), "--steps", "nccl_torchrun", timeout=300)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    doc, md = _results(tmp_path)
    (step,) = doc["steps"]
    assert step["name"] == "nccl_torchrun" and step["status"] == "pass", step
    r = step["result"]
    assert r["world_size"] == r["world_size_recorded"] == 2 and r["ngpu"] == 0 and r["device"] == "cpu"
    assert r["comm_backend"] == r["expected_backend"] == "gloo" and r["devices"] and len(r["devices"]) == 2
    assert "torch.distributed.run --standalone --nproc-per-node=2 -m dfmp2 run" in r["commands"][1]
    keys = {"e_hf", "e_corr_os", "e_corr_ss", "e_mp2"}
    assert set(r["energies_one_process"]) == set(r["energies_ranks"]) == set(r["abs_d"]) == keys
    assert max(r["abs_d"].values()) <= gpu_acceptance.E_RANKS_TOL and "2 ranks (gloo) vs one process" in step["reason"]
    assert "## torchrun over 2 rank(s): comm backend gloo" in md and "DRY RUN ON CPU" in md
