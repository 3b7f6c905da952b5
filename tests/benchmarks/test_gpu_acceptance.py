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
    """The acceptance document and its markdown; the summary beside them is checked for its name."""
    summ, doc, md = sorted(out.iterdir())  # gpu-acceptance_DRY_RUN_CPU*.json sorts first
    assert summ.name.startswith("gpu-acceptance_DRY_RUN_CPU") and json.loads(summ.read_text())["dry_run"] is True
    assert [doc.suffix, md.suffix] == [".json", ".md"] and all("DRY_RUN_CPU" in f.name for f in (doc, md))
    return json.loads(doc.read_text()), md.read_text()


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
    assert names[-2:] == ["pyscf_h2o_16", "pyscf_h2o_32"]
    assert set(names) | set(gpu_acceptance.NAMED_STEPS) == set(gpu_acceptance.BUDGET_S)
    assert not set(names) & set(gpu_acceptance.NAMED_STEPS)  # the gradient runs when named
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


# ------------------------------------------------------------------- issue 59: preset, summary, gradient
def test_issue59_preset_runs_its_eight_steps_in_order_within_the_default_total():
    preset = gpu_acceptance.PRESETS["issue59"]
    names = gpu_acceptance.steps_for(set(preset))
    assert names == [
        "pair_peak",
        "ours_h2o_16",
        "gpu4pyscf_h2o_16",
        "ours_h2o_32",
        "gpu4pyscf_h2o_32",
        "profile_h2o_32",
        "grad_h2o_16",
        "profile_h2o_16",
    ]
    budgets = sum(gpu_acceptance.BUDGET_S[n] for n in names)
    assert budgets <= gpu_acceptance.TOTAL_S and gpu_acceptance.BUDGET_S["grad_h2o_16"] == 120
    caps = gpu_acceptance.step_caps(names, gpu_acceptance.TOTAL_S, "preset", dry=False)
    assert sum(caps.values()) == pytest.approx(gpu_acceptance.TOTAL_S)  # the slack shared out, none lost
    assert all(caps[n] >= gpu_acceptance.BUDGET_S[n] for n in names)
    assert gpu_acceptance.step_caps(names, 100.0, "steps", dry=False)["pair_peak"] == float("inf")
    assert gpu_acceptance.step_caps(["pair_peak"], 520, "default", dry=True) == {"pair_peak": 150}
    assert (
        "--preset issue59" in gpu_acceptance.__doc__ and "gpu_acceptance.sh --preset issue59" in gpu_acceptance.__doc__
    )


def test_preset_and_steps_exclude_each_other_and_unknown_steps_are_one_line():
    with pytest.raises(SystemExit):
        gpu_acceptance._parser().parse_args(["--preset", "issue59", "--steps", "pair_peak"])
    with pytest.raises(SystemExit, match="unknown steps nope"):
        gpu_acceptance.main(["--dry-run", "--steps", "nope"])


E32 = -2439.7986469173


def _meta(dry=False):
    return {
        "date": "2026-01-01T00:00:00+00:00",
        "dry_run_cpu": dry,
        "host": "h",
        "cpu": "c",
        "cores": 16,
        "command": "gpu_acceptance.py",
        "gpu": {"name": "NVIDIA H200", "driver": "580.1"},
        "versions": {"torch": "2.11", "torch_cuda": "13.0", "triton": "3.6", "pyscf": "2.14.0", "gpu4pyscf": "1.9.0"},
        "blas": {},
    }


def _ran(name, status="pass", **result):
    return {"name": name, "status": status, "reason": "r", "seconds": 1.0, "budget_s": 10, "result": result}


def _issue59_doc(grad_d=5e-9, g32_s=10.0, e32_g4p=E32 + 5e-10):
    steps = [
        _ran(
            "pair_peak",
            verdict={"fastest_pct_of_gemm_peak": 85.0, "fastest_path": "triton"},
            dgemm_peak_tflops=58.0,
            dgemm_peak_n=8192,
            shape={"nocc": 160, "nvir": 608, "naux": 2688},
            fp64_dot_lowering="dmma",
            rows=[],
        ),
        _ran("ours_h2o_16", whole_s=2.0, dfrhf_s=1.0, timings={}, **E16),
        _ran("gpu4pyscf_h2o_16", whole_s=2.6, dfrhf_s=1.0, **{k: v + 2e-10 for k, v in E16.items()}),
        _ran("ours_h2o_32", whole_s=5.0, dfrhf_s=1.0, timings={}, e_hf=-2433.0, e_mp2=E32),
        _ran("gpu4pyscf_h2o_32", whole_s=g32_s, dfrhf_s=1.0, e_hf=-2433.0, e_mp2=e32_g4p),
        _ran(
            "grad_h2o_16",
            energy_s=4.0,
            gradient_s=10.0,
            gradient_over_energy=2.5,
            reference="scripts/results/gradient_h2o16_cpu_reference.json",
            agreement=gpu_acceptance.compare_gradient([[grad_d, 0, 0]], [[0, 0, 0]]),
        ),
    ]
    steps += [_ran(f"profile_{m}", wall_s=3.0, e_mp2=E32, timings={}, profile=_profile()) for m in ("h2o_16", "h2o_32")]
    cpu = {"h2o_16": {"e_mp2": E16["e_mp2"] - 3e-10, "source": "roofline_h2o16.json"}, "h2o_32": {"e_mp2": E32}}
    return {"meta": _meta(), "steps": steps, "cpu_energies": cpu}


def _profile():
    """A CUDA run's Profile.report, in its shape (dfmp2.timing)."""
    row = dict(wall_s=2.0, host_cpu_s=1.0, device_busy_s=0.5, memcpy_s=0.1, h2d_bytes=4_000_000, d2h_bytes=8)
    row |= dict(d2d_bytes=0, ops=900, host_waits=36)
    return {
        "device": "cuda:0",
        "tools": "t",
        "wall_s": 3.0,
        "outside_stages_s": 0.5,
        "set_up": {"prepare_s": 0.1, "profiler_start_s": 0.1, "until_first_stage_s": 0.1, "after_last_stage_s": 0.0},
        "stages": {"scf": row, "pair": row},
        "scf_cycles": 18,
        "scf_regions": {"jk": {"calls": 20, **row, "per_cycle_s": 0.11}},
        "top_kernels": [{"name": "sm90_xmma_gemm_f64", "calls": 40, "seconds": 0.4, "share": 0.8}],
        "top_kernels_by": "device busy seconds",
        "memcpy": None,
    }


def test_summary_of_a_run_that_meets_issue59():
    s = gpu_acceptance.summary(_issue59_doc(), source="gpu_acceptance_h200_issue59.json")
    assert s["met"] is True and s["dry_run"] is False and s["schema"] == gpu_acceptance.SUMMARY_SCHEMA
    assert (s["date"], s["gpu"], s["pair_dgemm_share"]) == ("2026-01-01T00:00:00+00:00", "NVIDIA H200", 0.85)
    assert s["versions"]["gpu4pyscf"] == "1.9.0" and s["versions"]["driver"] == "580.1"
    m16, m32 = s["molecules"]["h2o_16"], s["molecules"]["h2o_32"]
    for key in ("ours_wall_s", "gpu4pyscf_wall_s", "ours_e_mp2", "gpu4pyscf_e_mp2"):
        assert isinstance(m16[key], float) and isinstance(m32[key], float)
    assert m16["ours_over_gpu4pyscf"] == pytest.approx(2.0 / 2.6) and m16["bound"] == 0.8 and m16["met"] is True
    assert m32["ours_over_gpu4pyscf"] == 0.5 and m32["bound"] == 0.5 and m32["met"] is True  # at the bound
    assert m16["abs_d_e_mp2_vs_cpu"] == pytest.approx(3e-10, abs=1e-12) and m16["e_met_vs_cpu"] is True
    assert m16["cpu_e_mp2_source"] == "roofline_h2o16.json" and m16["missing"] == []
    g = s["gradient"]
    assert g["gradient_met"] is True and g["cost_met"] is True and g["max_abs_d_gradient"] == 5e-9
    assert json.loads(json.dumps(s)) == s  # plain JSON
    assert m32["stages"]["scf"] == {
        "wall_s": 2.0,
        "device_busy_s": 0.5,
        "h2d_bytes": 4_000_000,
        "d2h_bytes": 8,
        "host_waits": 36,
    }
    assert m32["scf_ms_per_cycle"]["jk"] == pytest.approx(2000 / 18)
    full = gpu_acceptance.profile_lines(_issue59_doc())
    assert "## profile_h2o_32: --profile on cuda:0 (wall 3.00 s)" in full
    assert "| scf | 2.000 | 1.000 | 0.500 | 4.0 | 0.0 | 900 | 36 |" in full
    assert "| `sm90_xmma_gemm_f64` | 40 | 0.400 |" in full
    md = "\n".join(gpu_acceptance.summary_lines(s))
    assert "## Issue 59 acceptance: all met: yes" in md and "| h2o_32: ours / gpu4pyscf wall | 5.00 / 10.00 s" in md


def test_summary_says_not_met_outside_each_bound():
    s = gpu_acceptance.summary(_issue59_doc(grad_d=2e-8, g32_s=9.0, e32_g4p=E32 + 2e-9))
    m32 = s["molecules"]["h2o_32"]
    assert m32["met"] is False and m32["e_met_vs_gpu4pyscf"] is False and m32["e_met_vs_cpu"] is True
    assert s["gradient"]["gradient_met"] is False and s["met"] is False
    doc = _issue59_doc()
    doc["steps"][0]["result"]["verdict"]["fastest_pct_of_gemm_peak"] = 66.8
    assert gpu_acceptance.summary(doc)["pair_dgemm"]["met"] is False


def test_summary_of_missing_steps_is_null_with_the_reason_never_a_number():
    doc = _issue59_doc()
    doc["steps"] = [s for s in doc["steps"] if s["name"] not in ("grad_h2o_16", "pair_peak")]
    doc["steps"][1] = {**doc["steps"][1], "status": "skipped", "reason": "gpu4pyscf not importable"}
    doc["cpu_energies"] = {"h2o_16": {"reason": "our CPU energy not read"}}
    s = gpu_acceptance.summary(doc)
    assert s["pair_dgemm_share"] is None and s["pair_dgemm"]["met"] is None and "not run" in s["pair_dgemm"]["missing"]
    m16 = s["molecules"]["h2o_16"]
    assert m16["gpu4pyscf_wall_s"] is None and m16["ours_over_gpu4pyscf"] is None and m16["met"] is None
    assert m16["cpu_e_mp2"] is None and m16["e_met_vs_cpu"] is None and m16["ours_wall_s"] == 2.0
    assert any("gpu4pyscf not importable" in w for w in m16["missing"])
    assert any("not read" in w for w in m16["missing"])
    g = s["gradient"]
    assert g["gradient_met"] is None and g["max_abs_d_gradient"] is None and "not run" in g["missing"]
    assert s["met"] is None  # nothing failed, something unknown
    empty = gpu_acceptance.summary({"meta": _meta(dry=True), "steps": []})
    assert empty["met"] is None and empty["dry_run"] is True
    assert all(v is None for m in empty["molecules"].values() for k, v in m.items() if k.endswith(("_s", "_mp2")))
    assert "not known" in "\n".join(gpu_acceptance.summary_lines(empty))


def test_results_are_three_files_named_for_the_run(tmp_path):
    doc = _issue59_doc()
    steps = {s["name"]: s for s in doc["steps"]}
    doc |= {"total_s": 520.0, "wall_s": 100.0, "verdict": "PASS", "checks": gpu_acceptance.checks(steps, {})}
    gpu_acceptance.write_results(doc, tmp_path, "_issue59", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "gpu-acceptance.json",
        "gpu_acceptance_h200_issue59.json",
        "gpu_acceptance_h200_issue59.md",
    ]
    s = json.loads((tmp_path / "gpu-acceptance.json").read_text())
    assert s["met"] is True and s["source"] == "gpu_acceptance_h200_issue59.json"
    assert "## Issue 59 acceptance: all met: yes" in (tmp_path / "gpu_acceptance_h200_issue59.md").read_text()
    doc["meta"] = _meta(dry=True)
    dry = tmp_path / "dry"
    dry.mkdir()
    gpu_acceptance.write_results(doc, dry, "_pair_peak", "")
    assert sorted(p.name for p in dry.iterdir())[0] == "gpu-acceptance_DRY_RUN_CPU_pair_peak.json"


def test_gradient_comparison_passes_5e_9_and_fails_2e_8():
    ref = [[0.01, -0.02, 0.03], [-0.01, 0.02, -0.03]]
    near = [[0.01 + 5e-9, -0.02, 0.03], [-0.01, 0.02, -0.03 - 5e-9]]
    far = [[0.01, -0.02 + 2e-8, 0.03], [-0.01, 0.02, -0.03]]
    ok, bad = gpu_acceptance.compare_gradient(near, ref), gpu_acceptance.compare_gradient(far, ref)
    assert ok["met"] is True and ok["max_abs_d"] == pytest.approx(5e-9, rel=1e-3) and ok["bound"] == 1e-8
    assert bad["met"] is False and bad["max_abs_d"] == pytest.approx(2e-8, rel=1e-3)
    assert gpu_acceptance.compare_gradient(ref[:1], ref)["met"] is False  # another molecule
    assert gpu_acceptance.compare_gradient([[float("nan"), 0, 0]] * 2, ref)["met"] is False
    opts = {"basis": "cc-pvdz", "frozen_core": False}
    res = {"gradient": far, "options": opts, "gradient_over_energy": 2.0}
    status, reason, out = gpu_acceptance.grad_verdict(dict(res), {"gradient": ref, "options": opts, "source": "f"})
    assert status == "fail" and "max |Δg| 2.0e-08" in reason and out["reference"] == "f"
    status, _, _ = gpu_acceptance.grad_verdict({**res, "gradient": near}, {"gradient": ref, "options": opts})
    assert status == "pass"
    other = {"gradient": ref, "options": {**opts, "frozen_core": True}}
    assert gpu_acceptance.grad_verdict(dict(res), other)[0] == "fail"
    status, reason, _ = gpu_acceptance.grad_verdict(dict(res), {"reason": "file not read"})
    assert status == "fail" and "file not read" in reason


def test_stored_cpu_gradient_is_our_default_run_of_h2o_16():
    from dfmp2.options import RunOptions

    xyz = ROOT / gpu_acceptance.WATERS["h2o_16"]
    ref = gpu_acceptance.grad_reference(xyz)
    assert "reason" not in ref, ref.get("reason")
    g = ref["gradient"]
    assert len(g) == ref["natm"] == 48 and all(len(row) == 3 for row in g)
    assert abs(sum(row[0] for row in g)) < 1e-6  # translation invariance: the forces add to zero
    default = RunOptions()
    assert ref["options"] == {
        "basis": default.basis,
        "auxbasis": ref["options"]["auxbasis"],
        "jk_auxbasis": ref["options"]["jk_auxbasis"],
        "scf_mode": default.scf_mode,
        "frozen_core": default.frozen_core,
        "method": "mp2",
        "precision": "fp64",
    }
    assert ref["e_mp2"] == pytest.approx(E16["e_mp2"], abs=1e-8)  # PySCF's, stored
    assert "not read" in gpu_acceptance.grad_reference(xyz, ROOT / "none.json")["reason"]
    assert "another geometry" in gpu_acceptance.grad_reference(ROOT / "inputs/water.xyz")["reason"]


def test_our_stored_cpu_energies_are_read_with_their_source(tmp_path):
    cpu = gpu_acceptance.stored_cpu_energies()
    assert set(cpu) == {"h2o_16", "h2o_32"} and all("e_mp2" in v for v in cpu.values()), cpu
    assert cpu["h2o_16"]["e_mp2"] == pytest.approx(E16["e_mp2"], abs=1e-8)  # against PySCF's stored
    assert cpu["h2o_32"]["source"] == "scripts/results/scaling_cc-pvdz.json"
    assert "not read" in gpu_acceptance.stored_cpu_energies(tmp_path)["h2o_32"]["reason"]


def test_issue59s_pair_peak_also_times_the_gemm_epilogue_variants(monkeypatch, tmp_path):
    from types import SimpleNamespace

    seen = []
    fake = lambda cmd, **kw: seen.append(cmd) or SimpleNamespace(returncode=1, stderr="no GPU", stdout="")
    monkeypatch.setattr(gpu_acceptance.subprocess, "run", fake)
    for preset in ("issue59", None):
        status, _, _ = gpu_acceptance.step_pair_peak({"tmp": str(tmp_path), "dry": False, "preset": preset})
        assert status == "fail"  # bench_cuda wrote nothing here
    assert "--variants" in seen[0] and "--variants" not in seen[1]
    names = gpu_acceptance.steps_for(set(gpu_acceptance.PRESETS["issue59"]))
    caps = gpu_acceptance.step_caps(names, gpu_acceptance.TOTAL_S, "preset", dry=False)
    assert caps["pair_peak"] >= gpu_acceptance.PRESET_BUDGET_S["pair_peak"] > gpu_acceptance.BUDGET_S["pair_peak"]
