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
import pytest

from dfmp2.benchmarks import fair_baseline as fb

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


@pytest.mark.heavy
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
    assert set(base["runs"]) == set(fb.SETTINGS)
    if fb.same_setting():  # neither OPENBLAS variable set here: as_set and unset are one process
        assert base["runs"]["unset"]["same_as"] == "as_set" and "tasks" not in base["runs"]["unset"]
    # the settings that ran (a core type this CPU lacks is not run): the fastest counts, whichever it was
    seconds = {k: sum(t["seconds"] for t in r["tasks"].values()) for k, r in base["runs"].items() if "tasks" in r}
    assert base["best"] == min(seconds, key=seconds.get), (base["best"], seconds)
    agree = {(a["molecule"], a["who"], a["against"]): a for a in doc["checks"]["agreement"]}
    live = agree[("h2o_16", "ours", gpu_acceptance.LIVE_PYSCF)]
    assert live["passed"] is True and live["abs_d_e_mp2"] < 1e-8
    assert agree[("h2o_32", "ours", gpu_acceptance.LIVE_PYSCF)]["passed"] is None  # ours failed: not compared
    assert agree[("h2o_16", "ours", gpu_acceptance.GPU4PYSCF)]["passed"] is None  # gpu4pyscf skipped
    assert gpu_acceptance.STORED_PYSCF not in {a["against"] for a in doc["checks"]["agreement"]}  # dry run
    assert md.count("DRY RUN ON CPU, NOT GPU NUMBERS") >= 2 and md.rstrip().endswith(
        "**DRY RUN ON CPU, NOT GPU NUMBERS.**"
    )
    for name in steps:
        assert f"| {name} | {steps[name]['status']} |" in md


@pytest.mark.heavy
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


@pytest.mark.heavy
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


def test_gpu_steps_run_first_and_leave_pyscf_what_is_left():
    names = gpu_acceptance.steps_for()
    assert names[-2:] == ["pyscf_h2o_16", "pyscf_h2o_32"] and set(names) == set(gpu_acceptance.BUDGET_S)
    assert names[:4] == ["cuda_tests", "pair_peak", "run_compare", "nccl_torchrun"]
    assert names.index("ours_h2o_16") < names.index("gpu4pyscf_h2o_16") < names.index("ours_h2o_32")
    gpu = sum(gpu_acceptance.BUDGET_S[n] for n in names[:-2])
    assert gpu <= gpu_acceptance.TOTAL_S - 90  # the PySCF steps keep a share of the default total
    assert gpu_acceptance.BUDGET_S["cuda_tests"] >= 150 and gpu_acceptance.BUDGET_S["ours_h2o_32"] >= 60


def _fake_children(monkeypatch):
    calls = []

    def run_child(spec, env, timeout):
        calls.append({"env": env, "timeout": timeout})
        e = {"e_hf": -76.0, "e_corr": -0.2, "e_mp2": -76.2}
        whole = {"seconds": 10.0 + len(calls), "scf_s": 8.0, "mp2_s": 2.0 + len(calls), **e}
        return {"tasks": {"whole": whole}, "peaks": {"rows": []}, "blas": {"env": {}}}

    monkeypatch.setattr(fb, "run_child", run_child)
    return calls


@pytest.mark.parametrize("var", [None, "OPENBLAS_L2_SIZE", "OPENBLAS_CORETYPE"])
def test_pyscf_step_runs_once_with_the_whole_budget_when_the_blas_variables_are_unset(monkeypatch, var):
    for v in fb.BLAS_VARS:
        monkeypatch.delenv(v, raising=False)
    if var:
        monkeypatch.setenv(var, "1048576" if var == "OPENBLAS_L2_SIZE" else "Haswell")
    calls = _fake_children(monkeypatch)
    monkeypatch.setattr(fb, "cpu_flags", lambda: {"avx2", "fma"})  # an AVX2 CPU: SkylakeX not run
    spec = {"xyz": {"h2o_16": "w.xyz"}, "step": "pyscf_h2o_16", "budget": 100.0, "dry": True}
    status, reason, res = gpu_acceptance.step_pyscf(spec)
    runs = res["baseline"]["runs"]
    assert status == "pass" and set(runs) == set(fb.SETTINGS), reason
    assert "tasks" not in runs["SkylakeX"] and "avx512f" in runs["SkylakeX"]["not_run"]
    assert calls[-1]["env"]["OPENBLAS_CORETYPE"] == "Haswell"
    if var is None:  # as_set and unset one setting: two processes (as_set, Haswell), half the budget each
        assert [c["timeout"] for c in calls] == [45.0, 45.0] and "fastest setting as_set of 2 runs" in reason
        assert runs["unset"]["same_as"] == "as_set" and "same as as_set" in runs["unset"]["not_run"]
        assert "tasks" not in runs["unset"] and res["baseline"]["best"] == "as_set"
        assert any("not run: same as as_set" in ln for ln in fb.markdown_lines(res["baseline"], {"env": {}}, {}))
    else:  # three processes, a third of the budget each, the second without the variable
        assert [round(c["timeout"], 2) for c in calls] == [28.33] * 3 and "fastest setting as_set of 3 runs" in reason
        assert var in calls[0]["env"] and var not in calls[1]["env"]
        assert all("tasks" in r for s, r in runs.items() if s != "SkylakeX")


def _step(status, **e):
    return {"status": status, "result": {**e, "whole_s": 1.0, "dfrhf_s": 0.5, "timings": {}}}


E16 = {"e_hf": -1216.512579762275, "e_mp2": -1219.837566254037}


def test_agreement_uses_gpu4pyscf_and_the_stored_reference_when_pyscf_did_not_finish():
    ours = {k: v + 2e-11 for k, v in E16.items()}
    steps = {
        "ours_h2o_16": _step("pass", **ours),
        "gpu4pyscf_h2o_16": _step("pass", **E16),
        "pyscf_h2o_16": {"status": "fail", "result": {"baseline": {}}},
        "ours_h2o_32": _step("pass", e_hf=-2432.0, e_mp2=-2439.0),
        "gpu4pyscf_h2o_32": _step("pass", e_hf=-2432.0, e_mp2=-2439.0 + 1e-6),
    }
    refs = {"h2o_16": {**E16, "source": "CPU run"}, "h2o_32": {"reason": "no stored reference for h2o_32 (pending)"}}
    c = gpu_acceptance.checks(steps, refs)
    a = {(r["molecule"], r["who"], r["against"]): r for r in c["agreement"]}
    stored, g4p = gpu_acceptance.STORED_PYSCF, gpu_acceptance.GPU4PYSCF
    assert a[("h2o_16", "ours", stored)]["passed"] is True and a[("h2o_16", "ours", stored)]["abs_d_e_mp2"] < 1e-10
    assert a[("h2o_16", "gpu4pyscf", stored)]["passed"] is True
    assert a[("h2o_16", "ours", g4p)]["passed"] is True
    assert a[("h2o_32", "ours", g4p)]["passed"] is False and a[("h2o_32", "ours", g4p)]["abs_d_e_mp2"] > 1e-7
    pend = [r for r in c["agreement"] if r["molecule"] == "h2o_32" and r["against"] != g4p]
    assert len(pend) == 2 and all(r["passed"] is None and "pending" in r["reason"] for r in pend)
    assert gpu_acceptance.checks(steps, {})["agreement"][0]["passed"] is None  # no reference at all: not compared


def test_agreement_prefers_pyscf_of_this_run_and_fails_outside_the_bound():
    steps = {
        "ours_h2o_16": _step("pass", **{k: v + 1e-7 for k, v in E16.items()}),
        "pyscf_h2o_16": _step("fail", **E16),  # one BLAS setting ran over: its energies still count
    }
    c = gpu_acceptance.checks(steps, {"h2o_16": {"e_hf": 0.0, "e_mp2": 0.0}})
    (row,) = [r for r in c["agreement"] if r["molecule"] == "h2o_16" and r["who"] == "ours" and r["passed"] is not None]
    assert row["against"] == gpu_acceptance.LIVE_PYSCF and row["passed"] is False


def test_stored_reference_file_has_h2o_16_and_a_pending_h2o_32(tmp_path):
    refs = gpu_acceptance.stored_references()
    assert refs["h2o_16"]["e_hf"] == E16["e_hf"] and refs["h2o_16"]["e_mp2"] == E16["e_mp2"]
    assert (
        refs["h2o_16"]["pyscf"] == "2.14.0" and "e_mp2" not in refs["h2o_32"] and "pending" in refs["h2o_32"]["reason"]
    )
    doc = json.loads(gpu_acceptance.REFERENCE.read_text())
    assert {"pyscf", "basis", "jk_fit", "mp2_fit", "thresholds"} <= set(doc)
    doc["molecules"]["h2o_16"]["xyz_sha256"] = "0" * 64  # another geometry: not a reference
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert "not the geometry" in gpu_acceptance.stored_references(tmp_path / "r.json")["h2o_16"]["reason"]
    assert "not read" in gpu_acceptance.stored_references(tmp_path / "none.json")["h2o_16"]["reason"]


def test_prepare_wheels_downloads_jsonschema_with_its_dependencies_and_threadpoolctl():
    bare, deps = gpu_acceptance.pip_downloads("/x")
    assert "--no-deps" in bare and any(a.startswith("pyscf==") for a in bare)
    assert "--no-deps" not in deps  # pip resolves attrs, referencing, rpds-py, ... for Python 3.12
    assert {a.split("==")[0] for a in deps if "==" in a} == {"jsonschema", "threadpoolctl"}
    for cmd in (bare, deps):
        assert cmd[cmd.index("--python-version") + 1] == "3.12" and "--only-binary=:all:" in cmd
        assert cmd[cmd.index("-d") + 1] == "/x"
