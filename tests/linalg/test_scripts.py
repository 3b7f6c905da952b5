"""Smoke tests of the linalg scripts on tiny shapes (they must keep running; numbers not checked)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(*args, env=None):
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.heavy
def test_bench_linalg_quick(tmp_path):
    out = tmp_path / "bench"
    r = run(
        "scripts/bench_linalg.py",
        "--quick",
        "--threads",
        "1",
        "--dtype",
        "fp32",
        "--repeats",
        "1",
        "--min-time",
        "0",
        "--warmup",
        "0",
        "--ops",
        "gemm,syrk,inv_sqrt_newton_schulz,mp2_pair_energy",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["peak"]["fp32"]["gflops"] > 0 and data["meta"]["backend"]["engine"] == "torch"
    assert {row["op"] for row in data["rows"]} == {"gemm", "syrk", "inv_sqrt_newton_schulz", "mp2_pair_energy"}
    assert "| gemm |" in out.with_suffix(".md").read_text()
    r2 = run("scripts/bench_linalg.py", "--rerender", str(out.with_suffix(".json")))
    assert r2.returncode == 0, r2.stderr


@pytest.mark.heavy
def test_bench_linalg_refuses_missing_device(tmp_path):
    import os

    no_gpu = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, on any machine
    r = run("scripts/bench_linalg.py", "--device", "cuda", "--quick", "--out", str(tmp_path / "b"), env=no_gpu)
    assert r.returncode != 0 and "no CUDA GPU" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "b.json").exists()


@pytest.mark.heavy
def test_newton_schulz_table_small(tmp_path):
    out = tmp_path / "ns.md"
    r = run("scripts/newton_schulz_table.py", "--n", "12", "--out", str(out))
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.count("| NS scaled |") == 18 and "## Summary" in text
