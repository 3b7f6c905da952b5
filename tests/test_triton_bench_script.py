"""scripts/bench_cuda.py stays runnable: its CPU dry run (Triton interpreter, tiny shape) writes a
JSON and markdown that say on every line they are not GPU numbers; without a GPU the real run
refuses with one clear line instead of producing numbers."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="Triton is not installed (pip install 'dfmp2[test]')")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "bench_cuda.py"


def _env():
    import os
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


def test_dry_run_cpu_is_labelled_and_complete(tmp_path):
    out = tmp_path / "bench"
    p = subprocess.run([sys.executable, str(SCRIPT), "--dry-run-cpu", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=_env())
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


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_real_run_without_gpu_refuses(tmp_path):
    p = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "b")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, env=_env())
    assert p.returncode != 0 and "no CUDA GPU" in p.stderr
    assert not (tmp_path / "b.json").exists()
