"""The roofline of a whole run: the result's executed flops against the algorithm's useful work
(dfmp2/benchmarks/roofline.py), and scripts/bench_roofline.py's record on the smallest input."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfmp2.benchmarks import roofline
from dfmp2.interfaces.api import run
from dfmp2.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs/water.xyz"


@pytest.mark.parametrize("frozen_core", [False, True])
def test_executed_flops_follow_the_useful_work(frozen_core):
    """The MP2 stage's and the JK fit's counts are exactly the model's (the same formulas over the
    run's shapes); the SCF's are its cycles' J/K builds and the dense O(nao^3) steps beside them,
    so near (iterations + 2) full builds (within a factor of two either way, room for a K build
    that does less than the model's GEMM + SYRK): a K left uncounted (most of a build), or every
    build counted twice, falls outside."""
    doc = json.loads(json.dumps(run(WATER, RunOptions(basis="cc-pvdz", frozen_core=frozen_core)).to_dict()))
    model, flops = roofline.useful_flops(doc), doc["flops"]
    assert set(model) == set(roofline.MODEL_STAGES)
    for stage in ("scf_fit", "metric", "transform", "fit", "pair"):
        assert flops[stage] == model[stage], stage
    assert 0.5 < flops["scf"] / model["scf"] < 2.0
    build = roofline.scf_build_flops(doc["shapes"]["nbasis"], doc["ran"]["scf"]["jk_factor"]["naux"], [5])
    assert build["K"] > 4 * build["J"] > 0  # water/cc-pVDZ: K dominates a build
    rows = roofline.stage_rows(doc["timings"], flops, model, peak_gflops=10.0)
    assert [r["stage"] for r in rows] == list(doc["timings"])
    assert all(r["executed_over_model"] is None for r in rows if r["stage"] in ("scf_integrals", "integrals"))
    whole = roofline.whole_run(doc["wall_s"], flops, 10.0)
    assert whole["flops"] == sum(flops.values()) and whole["pct_of_dgemm_peak"] == pytest.approx(
        10.0 * whole["gflops_per_s"]
    )


def test_pyscf_scf_has_no_scf_model():
    doc = json.loads(json.dumps(run(WATER, RunOptions(basis="sto-3g", scf_mode="pyscf-df")).to_dict()))
    assert "scf" not in roofline.useful_flops(doc) and doc["flops"]["scf"] == 0


@pytest.mark.heavy
@pytest.mark.parametrize("fresh", [False, True])
def test_bench_roofline_script_on_water(tmp_path, fresh):
    """In one process, or (``--fresh``) each run in its own, with its own DGEMM peak."""
    out = tmp_path / "roof"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    p = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts/bench_roofline.py"),
            str(WATER),
            "--no-pyscf",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--threads",
            "1",
            "--peak-sizes",
            "64",
            "--out",
            str(out),
            *(["--fresh"] if fresh else []),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env=env,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["gemm_peak"]["fp64"]["gflops"] > 0 and doc["pyscf"] == {"skipped": "--no-pyscf"}
    stages = {r["stage"]: r for r in doc["stages"]}
    assert stages["pair"]["flops"] > 0 and stages["pair"]["executed_over_model"] == 1.0
    assert doc["whole"]["flops"] == sum(r["flops"] for r in doc["stages"]) and doc["flops_same_every_repeat"]
    assert doc["blas"]["ours"]["threadpools"] and doc["versions"]["dfmp2"] and doc["date"]
    md = out.with_suffix(".md").read_text()
    assert "| **whole run** (wall) |" in md and "% of the DGEMM roofline" in md and "| pair |" in md
    if fresh:  # the run's own process measured the peak its share uses
        (run,) = doc["runs"]
        assert run["dgemm_peak"] > 0 and doc["options"]["fresh"] and "new process" in md
        expected = 100 * doc["whole"]["flops"] / (run["wall_s"] * 1e9 * run["dgemm_peak"])
        assert doc["whole"]["pct_each_run"] == [pytest.approx(expected)]
