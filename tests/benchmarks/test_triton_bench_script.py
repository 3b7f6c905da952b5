"""scripts/bench_cuda.py stays runnable: its CPU dry run (Triton interpreter, tiny shape) writes a
JSON and markdown that say on every line they are not GPU numbers; without a GPU the real run
refuses with one clear line instead of producing numbers; a probe or path that fails is reported
and the rest is still measured."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton is not installed (pip install 'dfmp2[test]')")

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench_cuda.py"


def _env():
    """The script's environment: it decides about the interpreter itself, and sees no GPU (a CPU
    dry run, or the refusal without a GPU, on any machine)."""
    import os

    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    env["CUDA_VISIBLE_DEVICES"] = ""
    return env


@pytest.fixture
def working_interpreter():
    from triton_interpreter import interpreter_defect

    reason = interpreter_defect()
    if reason:
        pytest.skip(reason)


@pytest.mark.heavy
def test_dry_run_cpu_is_labelled_and_complete(tmp_path, working_interpreter):
    out = tmp_path / "bench"
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run-cpu", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=_env(),
    )
    assert p.returncode == 0, p.stderr[-3000:]
    assert all(line.startswith("[CPU INTERPRETER, NOT A GPU]") for line in p.stdout.splitlines() if line)
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["meta"]["dry_run_cpu"] and "NOT A GPU" in doc["meta"]["gpu"]["name"]
    assert set(doc["peaks"]) == {"fp64", "fp32"}
    paths = {(r["precision"], r["path"]) for r in doc["pair"]}
    assert paths == {(p, q) for p in ("fp64", "fp32") for q in ("torch", "gemm+epilogue", "fused")}
    for r in doc["pair"]:
        assert r["error"] is None and r["run_to_run_identical"]
        if r["path"] != "torch":
            assert all("[Triton interpreter" in k for k in r["kernels"])
            assert r["abs_diff_vs_torch"] <= (1e-14 if r["precision"] == "fp64" else 1e-6)
    assert "target_pct_dgemm" in doc["meta"]["verdict"]["fp64"]
    md = out.with_suffix(".md").read_text()
    assert "NOT A GPU MEASUREMENT" in md and "% of GEMM peak" in md


def test_real_run_without_gpu_refuses(tmp_path):
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path / "b")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env=_env(),
    )
    assert p.returncode != 0 and "no CUDA GPU" in p.stderr
    assert not (tmp_path / "b.json").exists()


# Loads the script as a module, breaks the fused kernel in fp64 (as Triton 3.6 did) and the PTX
# probe, then runs its CPU dry run: the interpreter is chosen before anything imports triton.
_INJECT = """
import importlib.util, os, sys
os.environ["TRITON_INTERPRET"] = "1"
sys.path.insert(0, {root!r})
import dfmp2.kernels.triton.fused_pair_energy as fpe
real = fpe.fused_pair_energy
def broken(Bi, *args, **kwargs):
    if Bi.dtype.is_floating_point and Bi.element_size() == 8:
        raise RuntimeError("injected: fp64 dot does not compile\\nsecond line")
    return real(Bi, *args, **kwargs)
fpe.fused_pair_energy = broken
spec = importlib.util.spec_from_file_location("bench_cuda", {script!r})
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)
def probe(*args, **kwargs):
    raise ValueError("injected probe failure")
bench.fp64_dot_lowering = probe
bench.main(["--dry-run-cpu", "--out", {out!r}])
"""


@pytest.mark.heavy
def test_dry_run_reports_failures_and_measures_the_rest(tmp_path, working_interpreter):
    out = tmp_path / "bench"
    code = _INJECT.format(root=str(ROOT), script=str(SCRIPT), out=str(out))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
    assert p.returncode == 1, p.stderr[-3000:]  # a default path and a probe failed
    assert "Traceback" not in p.stderr
    doc = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["precision"], r["path"]): r for r in doc["pair"]}
    assert set(rows) == {(p, q) for p in ("fp64", "fp32") for q in ("torch", "gemm+epilogue", "fused")}
    bad = rows[("fp64", "fused")]
    assert bad["error"].startswith("KernelError: pair-step kernel triton.fused_pair_energy(fp64")
    assert "injected: fp64 dot does not compile second line" in bad["error"] and "\n" not in bad["error"]
    assert "Triton interpreter" in bad["error"] and "gflops" not in bad
    for key, r in rows.items():  # every other path was still measured
        if key != ("fp64", "fused"):
            assert r["error"] is None and r["gflops"] > 0 and r["run_to_run_identical"], key
    assert doc["meta"]["fp64_dot_lowering"] == "probe failed: ValueError: injected probe failure"
    assert [f["what"] for f in doc["failures"]] == ["fp64 fused default", "fp64 dot lowering probe (fused kernel PTX)"]
    assert doc["meta"]["verdict"]["fp64"]["fastest_path"] == "gemm+epilogue"
    md = out.with_suffix(".md").read_text()
    assert "| fp64 | fused | default | failed: KernelError" in md and "## Failures" in md
    assert "FAILED: fp64 fused default: KernelError" in p.stdout
