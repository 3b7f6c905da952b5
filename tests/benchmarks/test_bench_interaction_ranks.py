"""scripts/bench_interaction_ranks.py on the smallest case: every command it times ran, the ranks'
interaction energies are one process's bit for bit at the ranks' thread count, and the table says so."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.heavy
def test_interaction_over_two_ranks_is_timed_against_one_process(tmp_path):
    out = tmp_path / "bir"
    cmd = [sys.executable, "scripts/bench_interaction_ranks.py", "--bases", "sto-3g", "--ranks", "2", "--repeat", "1"]
    r = subprocess.run([*cmd, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads(out.with_suffix(".json").read_text())
    (row,) = rep["rows"]
    assert set(row["runs"]) == {"plain", "plain 1 thread", "torchrun 1", "torchrun 2", "launcher"}
    s = row["summary"]
    assert s["bitwise"] and s["largest_difference_eh"] == 0.0
    assert all(w > 0 for w in s["wall"].values()) and s["own"]["torchrun 2"] > 0
    assert "| sto-3g |" in out.with_suffix(".md").read_text()
