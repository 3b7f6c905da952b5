#!/usr/bin/env python
"""GPU acceptance in one command: everything a GPU session should check, within a
total time budget (default 520 s, under the device tool's 10-minute limit per command).

    python scripts/gpu_acceptance.py                     # on a CUDA machine
    python scripts/gpu_acceptance.py --dry-run --out-dir /tmp/acc   # here, on the CPU (1-2 min on 2 busy cores)
    python scripts/gpu_acceptance.py --steps pyscf_h2o_32 --total-s 520   # one step again, alone
    python scripts/gpu_acceptance.py --preset issue59    # issue 59's steps alone (PRESETS), with gpu4pyscf
    python scripts/gpu_acceptance.py --dry-run --preset issue59 --out-dir /tmp/acc59   # the same here (1-2 min)
    python scripts/gpu_acceptance.py --prepare-wheels    # here: the wheels a GPU session carries

Steps, in this order (the GPU steps first, PySCF's CPU steps last), each in its own subprocess (its
own process group) with its own budget in seconds (BUDGET_S: what the first real run on an H200 took,
with a margin; see the comment there), cut to what is left of the total; a step that fails, raises or
runs over is recorded as 'fail' with the reason and the next step runs (a step that cannot run here,
as gpu4pyscf when it is not installed, is 'skipped' with the reason, never 'pass'):

  cuda_tests        (150 s) pytest -m cuda on the files that hold cuda tests (all skipped on a GPU = fail)
  pair_peak         (50 s) scripts/bench_cuda.py --no-sweep --precisions fp64 (nocc 160, nvir 608, naux 2688):
                    the fp64 pair step's share of the DGEMM peak of the same GPU measured in the
                    same run (torch.matmul, square n = 4096/8192/12288, median of 5); in --preset issue59
                    also bench_cuda's gemm+epilogue variants (--variants; PRESET_BUDGET_S 75 s)
  run_compare       (45 s) dfmp2 run and dfmp2 compare --devices cpu,cuda on (H2O)8: |ΔE_corr| cuda vs cpu
  nccl_torchrun     (35 s) torchrun --standalone --nproc-per-node N -m dfmp2 run water --device cuda, one
                    rank per GPU (N = 2 with 2+ GPUs; a one-GPU machine runs 1 rank and records that NCCL
                    was not exercised), against the one-process cuda run: the energies and their
                    differences (bound 1e-10 Eh), the world size and comm backend (nccl) the result
                    records. Dry run: 2 gloo ranks on the CPU, STO-3G water
  ours_<mol>        (30 s (H2O)16, 70 s (H2O)32) the whole dfmp2 run and its DF-RHF stages (SCF_STAGES),
                    after a warm-up on water (Triton's compile outside the timing); where
                    'auto' took gpu4pyscf for the MP2 integrals, the run again with --integrals
                    gpu4pyscf: the JK factor's integral seconds by each engine (jk_factor_s)
  gpu4pyscf_<mol>   (25 s each) gpu4pyscf's DF-RHF + DF-MP2 on the same molecule (same JK-fit and MP2-fit
                    sets, same SCF thresholds), after a warm-up on water
                    (ours then gpu4pyscf on (H2O)16, then the same on (H2O)32)
  profile_h2o_32,   (60 s, 70 s; not in the default run: --preset issue59 or --steps) dfmp2 run --profile
  profile_h2o_16    after a warm-up on water: per stage wall, host and device seconds, bytes moved,
                    ops, host waits; per part of the SCF's cycles; the top kernels (dfmp2.timing.Profile)
  grad_h2o_16       (120 s; not in the default run: --preset issue59 or --steps) our (H2O)16 energy run and
                    gradient run (dfmp2.drivers.gradient.run_gradient) on the device after a warm-up on water
                    (energy and gradient): both walls, gradient / energy (bound GRAD_COST = 3), and max |Δg|
                    in Eh/bohr against our stored CPU gradient of the same molecule and options
                    (GRAD_REFERENCE; bound GRAD_TOL = 1e-8); then a UHF one (glycyl radical) timed the same
                    way, its gradient against the CPU's made in the step. Dry run: water (and the water
                    cation) on the CPU against a second CPU run in the same step (only the code path)
  pyscf_h2o_16,     (90 s; (H2O)32: all that is left) PySCF's DF-RHF + DF-MP2 on the CPU
  pyscf_h2o_32      (dfmp2/benchmarks/fair_baseline.py): where OPENBLAS_CORETYPE or OPENBLAS_L2_SIZE is
                    set, twice, each in its own process with half the budget: environment as set, and
                    without the two; the fastest is the reference for speed. Where neither is set (the
                    GPU machine) the two settings are one: ONE process with the whole budget, the other
                    recorded as not run ('same as as_set'). Each run's BLAS and numpy's GEMM peak

Then 'agreement' (|ΔE_HF|, |ΔE_MP2|, bound 1e-8 Eh), per molecule: ours and gpu4pyscf against PySCF
of this run where its step has energies, else against PySCF's stored CPU reference
(scripts/results/pyscf_reference_waters.json: PySCF 2.14.0, same basis, fitting sets and thresholds;
an entry marked 'pending' or whose XYZ changed counts as none, and the rows say 'not compared'); and
ours against gpu4pyscf (independent code) whenever both passed. Never against our own numbers. And
'speed' (PySCF's faster setting / ours, gpu4pyscf / ours; the whole run's pair step in % of the
DGEMM peak). Times are wall seconds, energies Hartree. Writes ONE JSON and ONE markdown file:
scripts/results/gpu_acceptance_<gpu>.{json,md} (<gpu>: the GPU's model, e.g. h200; (date, GPU, driver/CUDA, versions of torch,
triton, pyscf, gpu4pyscf, every step), and beside them issue 59's figures, summary() of that JSON:
gpu-acceptance.json (schema SUMMARY_SCHEMA: date, gpu, versions, pair_dgemm_share, per molecule ours and
gpu4pyscf's walls and E_MP2, their ratio against its bound (ISSUE59_WALL_BOUND), |ΔE_MP2| against
gpu4pyscf and against our own stored CPU energy (CPU_ENERGIES, bound CPU_E_TOL = 1e-9 Eh: a device-vs-CPU
check of the same program), the gradient's figures; a figure whose step did not pass is null and its
check's 'met' null, with the reason). A run of chosen --steps names its files apart (the step names in
the name); a --preset run by the preset. Exit status 1 when a step or a check failed, else 0.

--dry-run: the same steps on --device cpu with the smallest inputs (water for (H2O)8 and (H2O)16,
(H2O)2 for (H2O)32; bench_cuda's CPU interpreter run), written to --out-dir (default a temporary
directory, never scripts/results/) as gpu_acceptance_DRY_RUN_CPU.* and gpu-acceptance_DRY_RUN_CPU.json
(its 'dry_run': true); the files and every printed line say DRY RUN ON CPU, NOT GPU NUMBERS.

## On the GPU machine (device tool)

PySCF is not installed there and nothing can be downloaded, so it travels with the call, and a
call carries at most 64 MiB (the checkout is about 4.2 MB). The GPU image has torch, triton, numpy,
scipy, h5py, cupy, pytest, but neither jsonschema (the cuda tests validate result documents with it:
3 failures on 2026-11-27 without it) nor threadpoolctl, so those travel too, with what pip says
jsonschema needs for Python 3.12 (attrs, jsonschema-specifications, referencing, rpds-py (cp312
manylinux x86-64), typing-extensions). Measured 2026-11-27 by --prepare-wheels: the pyscf 2.14.0
wheel is 50.4 MiB, the extras 0.6 MiB together, so .whl/ is 51.0 MiB (fits); gpu4pyscf-cuda13x 1.9.0
is 78.4 MiB (does not fit, nor with PySCF: all unpacked, tar.xz -9, 92.6 MiB), so with gpu4pyscf
the packed tree travels in two pieces of at most 58 MiB (.g4a 58.0 MiB, .g4b 34.6 MiB) over two
calls; cupy-cuda13x 14.2 is on that machine already. Here, once (a few minutes: 8.5 on 2 busy
cores, most of it xz):

    python scripts/gpu_acceptance.py --prepare-wheels     # .whl/ and .g4a/, .g4b/ (git-ignored); prints sizes

Then paste into the device tool, either (one call, no gpu4pyscf: its steps are 'skipped')

    run(command="bash scripts/gpu_acceptance.sh", carry=[".whl"], timeout_s=600)

or, with gpu4pyscf, two calls back to back (the machine stays warm 30 s after a call; /tmp
survives while it is warm, the carried folders do not):

    run(command="bash scripts/gpu_acceptance.sh stage", carry=[".g4a"], timeout_s=300)
    run(command="bash scripts/gpu_acceptance.sh", carry=[".g4b"], timeout_s=600)

Issue 59 alone (its eight steps, PRESETS; budgets 475 s scaled to the 520; gpu4pyscf needed, so the same two calls):

    run(command="bash scripts/gpu_acceptance.sh stage", carry=[".g4a"], timeout_s=300)
    run(command="bash scripts/gpu_acceptance.sh --preset issue59", carry=[".g4b"], timeout_s=600)

The files come back under the call's files_at: gpu_acceptance_<gpu>[_issue59].json and .md,
gpu-acceptance.json and the log; copy the three result files into scripts/results/ and commit
them. If the second call says the machine went cold (exit 3), make both calls again. Steps that
ran over their budget can be rerun alone in a further call with the same carry: add
`--steps NAME[,NAME]` after gpu_acceptance.sh (the chosen steps share the whole budget; their
files, gpu-acceptance_<steps>.json too, are named apart).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

MARK = "GPU_ACCEPTANCE_STEP "
TOTAL_S = 520.0  # the device tool allows 600 s a command; installs, imports take the rest
E_TOL = 1e-8  # Eh: |ΔE_HF| and |ΔE_MP2| against PySCF (SCFs converged to 1e-12 Eh)
E_RANKS_TOL = 1e-10  # Eh: torchrun's energies against one process's (the split SCF sums J/K in another order)
WATERS = {
    "h2o_08": "inputs/water_clusters/h2o_08.xyz",
    "h2o_16": "inputs/water_clusters/h2o_16.xyz",
    "h2o_32": "inputs/water_clusters/h2o_32.xyz",
}
DRY = {"h2o_08": "inputs/water.xyz", "h2o_16": "inputs/water.xyz", "h2o_32": "inputs/water_clusters/h2o_02.xyz"}
# Seconds per step in a full run, in the order they run: the GPU steps first, PySCF's CPU steps last.
# From the first real run, 2026-11-27, NVIDIA H200 (16 CPU cores, torch 2.11+cu130, Triton 3.6,
# gpu4pyscf 1.9), --total-s 500; seconds taken (old budget):
#   cuda_tests 100.1 (100, killed on the fresh machine; 52 alone on the warm one), pair_peak 41.1 (70),
#   run_compare 34.8 (45), nccl_torchrun 28.7 (60), ours_h2o_16 15.7 (45), gpu4pyscf_h2o_16 17.4 (40),
#   ours_h2o_32 50.2 (50, killed; 39.3 alone: DF-RHF 8.51 s, whole 18.44 s), gpu4pyscf_h2o_32 16.2 (45),
#   pyscf_h2o_16 over 25 s in each BLAS setting, pyscf_h2o_32 over 55 s in each.
# The GPU steps' budgets add up to 420 s; they took 304 s there (two of them killed) and would take
# about 245 s on a warm machine, so the PySCF steps get some 160 to 270 s of the default 520, at
# least 95 s; pyscf_h2o_32's budget is whatever is left.
# Second run, 2026-11-27, same machine type, --total-s 480: cuda_tests 126.3, pair_peak 42.0,
#   run_compare 37.7, nccl_torchrun 30.2, ours_h2o_16 20.6, gpu4pyscf_h2o_16 22.1, ours_h2o_32 killed at
#   60 (auto then took gpu4pyscf for the JK factor: 52 s of integrals), gpu4pyscf_h2o_32 23.8,
#   pyscf_h2o_16 80.1 (72.4 s whole). The ours steps now also run the JK factor through gpu4pyscf.
# PySCF's energies that do not finish in time are replaced by the stored reference (REFERENCE).
BUDGET_S = {
    "cuda_tests": 150,
    "pair_peak": 50,
    "run_compare": 45,
    "nccl_torchrun": 35,
    "ours_h2o_16": 30,
    "gpu4pyscf_h2o_16": 25,
    "ours_h2o_32": 70,
    "gpu4pyscf_h2o_32": 25,
    # Never run on a GPU yet: our (H2O)16 energy took about 4 s on an H200 (after the warm-up); the
    # gradient run is the energy plus the stage, which took 2.8 energies on a 2-core CPU
    # (gradient_h2o16.md), so some 15 s, plus the imports and the warm-up on water (energy and
    # gradient: Triton's compiles, some 15-20 s as in ours_h2o_16). 90 s leaves a factor of 2 or more
    # for a first run's surprises (derivative integrals on the host) and still fits issue 59's preset.
    # + the UHF part (uhf_gradient_check: glycyl on the device, and on the CPU for the comparison)
    "grad_h2o_16": 120,
    # dfmp2 run --profile after a warm-up on water: the whole run once more (about 4 s at (H2O)16,
    # 18 s at (H2O)32 on an H200), its parts synchronised, and the profiler's stop (0.7 s per
    # (H2O)8 run on 2 CPU cores; more events on a GPU); never run on a GPU yet
    "profile_h2o_32": 60,
    "profile_h2o_16": 70,  # and the gradient's: run_gradient(profile=True)
    "pyscf_h2o_16": 90,
    "pyscf_h2o_32": TOTAL_S,  # all that is left
}
GPU_STEPS = ["cuda_tests", "pair_peak", "run_compare", "nccl_torchrun"] + [
    f"{w}_{m}" for m in ("h2o_16", "h2o_32") for w in ("ours", "gpu4pyscf")
]
PYSCF_STEPS = ["pyscf_h2o_16", "pyscf_h2o_32"]
# Steps run only when named (--steps, --preset): in the default run they would leave PySCF's steps
# too little of the total (their budgets would add up to 510 of the 520 s)
NAMED_STEPS = ["profile_h2o_32", "grad_h2o_16", "profile_h2o_16"]
ORDER = GPU_STEPS + NAMED_STEPS + PYSCF_STEPS  # the order steps run in, whichever are chosen
# --preset NAME: the steps of one task in one device call. issue59: the pair step's share of DGEMM,
# ours and gpu4pyscf on (H2O)16 and (H2O)32, the gradient; each with its BUDGET_S scaled up so
# that together they fill --total-s (a hung step still leaves the others their share)
PRESETS = {
    "issue59": [
        "pair_peak",  # with bench_cuda --variants
        "ours_h2o_16",
        "gpu4pyscf_h2o_16",
        "ours_h2o_32",
        "gpu4pyscf_h2o_32",
        "profile_h2o_32",
        "grad_h2o_16",
        "profile_h2o_16",
    ]
}
# a preset's budgets where they differ from BUDGET_S: issue59's pair_peak also times bench_cuda's three
# gemm+epilogue variants (--variants: about 15 s on an H200 beside the 41-42 s of the rest)
PRESET_BUDGET_S = {"pair_peak": 75}
GRAD_TOL = 1e-8  # Eh/bohr: max |Δg| of the device's gradient against our stored CPU gradient (issue 59)
GRAD_COST = 3.0  # issue 59: the gradient run (energy + stage) costs at most 3 energy runs (wall)
# our CPU DF-MP2 gradient of (H2O)16/cc-pVDZ, default options (`--make-grad-reference` wrote it)
GRAD_REFERENCE = ROOT / "scripts" / "results" / "gradient_h2o16_cpu_reference.json"
# the options the gradient and its reference must share (the result document's names)
GRAD_OPTIONS = ("basis", "auxbasis", "jk_auxbasis", "scf_mode", "frozen_core")
# PySCF's energies computed on the developers' CPU, for when the pyscf_<mol> step did not pass
REFERENCE = ROOT / "scripts" / "results" / "pyscf_reference_waters.json"
LIVE_PYSCF, STORED_PYSCF, GPU4PYSCF = "PySCF (this run, CPU)", "PySCF (stored reference, CPU)", "gpu4pyscf (this run)"
# Issue 59's bounds: our whole `dfmp2 run` over gpu4pyscf's DF-RHF + DF-MP2 (wall, warm process)
ISSUE59_WALL_BOUND = {"h2o_16": 0.8, "h2o_32": 0.5}
PAIR_SHARE_BOUND = 0.8  # the pair step's share of the DGEMM peak of the same process (pair_peak)
CPU_E_TOL = 1e-9  # Eh: |ΔE_MP2| of the device run against gpu4pyscf and against our own CPU run
SUMMARY_SCHEMA = "dfmp2-gpu-acceptance-summary/1"
# Our own CPU E_MP2 of the real clusters (the 'within 1e-9 Eh of our CPU run' check: the same program
# on two devices, as issue 59 asks; the independent references are PySCF's and gpu4pyscf's), read
# from committed records: (file, what the number is). Default options but the memory limit, which
# moves data (B, the JK factor) to disk and not the energies: (H2O)16 at 2 GB in scaling_cc-pvdz.json
# is within 1e-12 Eh of roofline_h2o16.json's default run.
CPU_ENERGIES = {
    "h2o_16": ("scripts/results/roofline_h2o16.json", "e_mp2 of bench_roofline.py's `dfmp2 run` (default options)"),
    "h2o_32": (
        "scripts/results/scaling_cc-pvdz.json",
        "row n = 32, ours: e_hf + e_corr of bench_scaling.py's `dfmp2 run --memory 2GB` (B, JK factor on disk)",
    ),
}
# what --prepare-wheels downloads (Python 3.12, x86-64): PySCF without its dependencies (numpy, scipy,
# h5py are on the GPU machine), and with theirs what the GPU image lacks: jsonschema (the cuda tests
# validate result documents; our 'test' extra) and threadpoolctl (fair_baseline's BLAS record)
WHEELS = ["pyscf==2.14.0"]
WITH_DEPS = ["jsonschema==4.26.0", "threadpoolctl==3.8.0"]
G4P = "gpu4pyscf-cuda13x==1.9.0"  # cupy-cuda13x is on the GPU machine already
PIECE_MIB = 58  # a carried piece: 64 MiB a call, less the checkout
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]


def mol_key(step: str) -> str | None:
    m = re.search(r"(h2o_\d+)$", step)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------ the steps
def step_cuda_tests(spec):
    files = (
        ["tests/linalg/test_cuda.py"]
        if spec["dry"]
        else sorted(  # the files that hold cuda tests
            str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if "mark.cuda" in p.read_text()
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfEs", "--disable-warnings", "-m", "cuda", "-p", "no:cacheprovider"]
        + files,
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    last = (p.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", last)}
    res = {
        "command": f"pytest -q -rfEs --disable-warnings -m cuda {' '.join(files)}",
        "summary": last,
        "counts": counts,
        "failed": [ln for ln in p.stdout.splitlines() if ln.startswith(("FAILED ", "ERROR "))],  # -rfE: each one
        "returncode": p.returncode,
        "tail": p.stdout[-1500:],
    }
    if counts.get("failed") or counts.get("error") or counts.get("errors") or p.returncode not in (0, 5):
        return "fail", f"pytest: {last}", res
    if not counts.get("passed"):
        return ("skipped" if spec["dry"] else "fail"), f"no cuda test ran: {last}", res
    return "pass", last, res


def step_pair_peak(spec):
    out = Path(spec["tmp"]) / "bench_cuda"
    cmd = [sys.executable, "scripts/bench_cuda.py", "--no-sweep", "--precisions", "fp64", "--out", str(out)]
    if spec.get("preset") == "issue59":  # its budget scaled for them: about 15 s more on an H200
        cmd.append("--variants")
    if spec["dry"]:
        cmd.append("--dry-run-cpu")
    env = {**os.environ, **({"CUDA_VISIBLE_DEVICES": ""} if spec["dry"] else {})}
    env.pop("TRITON_INTERPRET", None)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if not out.with_suffix(".json").exists():
        return "fail", f"bench_cuda exit {p.returncode}: {(p.stderr.strip().splitlines() or ['no output'])[-1]}", {}
    doc = json.loads(out.with_suffix(".json").read_text())
    rows = [
        {
            k: r.get(k)
            for k in (
                "path",
                "config",
                "median_s",
                "gflops",
                "pct_of_gemm_peak",
                "error",
                "abs_diff_vs_torch",
                "kernels",
            )
        }
        for r in doc["pair"]
    ]
    v = doc["meta"].get("verdict", {}).get("fp64", {})
    res = {
        "dgemm_peak_tflops": doc["peaks"]["fp64"].get("tflops"),
        "dgemm_peak_n": doc["peaks"]["fp64"].get("n"),
        "shape": doc["meta"]["shape"],
        "rows": rows,
        "verdict": v,
        "gpu": doc["meta"]["gpu"],
        "fp64_dot_lowering": doc["meta"].get("fp64_dot_lowering"),
        "failures": doc.get("failures"),
    }
    if p.returncode != 0:
        return (
            "fail",
            "; ".join(f["what"] + ": " + f["error"] for f in doc.get("failures", [])) or f"exit {p.returncode}",
            res,
        )
    best = v.get("fastest_pct_of_gemm_peak")
    return (
        "pass",
        (
            f"fastest {v.get('fastest_path')} at {best:.1f}% of DGEMM ({res['dgemm_peak_tflops']:.2f} TFLOP/s)"
            if best is not None
            else "ran"
        ),
        res,
    )


def step_run_compare(spec):
    xyz, dev, tmp = spec["xyz"]["h2o_08"], spec["device"], Path(spec["tmp"])
    devices = "cpu" if spec["dry"] else f"cpu,{dev}"
    cli = [sys.executable, "-m", "dfmp2.cli.main"]
    r = subprocess.run(
        [*cli, "run", xyz, "--device", dev, "--json", str(tmp / "run.json")], capture_output=True, text=True, cwd=ROOT
    )
    c = subprocess.run(
        [*cli, "compare", xyz, "--devices", devices, "--json", str(tmp / "compare.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    res = {
        "commands": [f"dfmp2 run {xyz} --device {dev}", f"dfmp2 compare {xyz} --devices {devices}"],
        "returncodes": [r.returncode, c.returncode],
    }
    if r.returncode != 0 or not (tmp / "run.json").exists():
        return "fail", f"dfmp2 run exit {r.returncode}: {_last(r.stderr)}", res
    run = json.loads((tmp / "run.json").read_text())
    res["run"] = {
        **{k: run["energies"][k] for k in ("e_hf", "e_corr", "e_mp2")},
        "timings": run["timings"],
        "kernels": run["ran"].get("kernels"),
        "integrals": run["ran"].get("integrals"),
    }
    if c.returncode != 0 or not (tmp / "compare.json").exists():
        return "fail", f"dfmp2 compare exit {c.returncode}: {_last(c.stderr)}", res
    cmp_ = json.loads((tmp / "compare.json").read_text())
    res["compare"] = {
        "summary": cmp_["summary"],
        "devices": [
            {k: d.get(k) for k in ("device", "status", "reason", "energies", "seconds")} for d in cmp_["devices"]
        ],
    }
    e = {d["device"]: d["energies"]["e_corr"] for d in cmp_["devices"] if d.get("energies")}
    if dev in e and "cpu" in e:
        res["abs_d_e_corr_vs_cpu"] = abs(e[dev] - e["cpu"])
    res["abs_d_e_corr_run_vs_compare_cpu"] = abs(res["run"]["e_corr"] - e["cpu"]) if "cpu" in e else None
    ok = cmp_["summary"]["passed"] and (res["abs_d_e_corr_run_vs_compare_cpu"] or 0) <= 1e-10
    return (
        ("pass" if ok else "fail"),
        (
            f"|ΔE_corr| {dev} vs cpu {res.get('abs_d_e_corr_vs_cpu', 0):.1e} Eh; "
            f"compare passed: {cmp_['summary']['passed']}"
        ),
        res,
    )


def step_nccl_torchrun(spec):
    """``torchrun --standalone --nproc-per-node N -m dfmp2 run water --device cuda``, one rank per GPU
    (N = 2 with two GPUs or more; 1 on a one-GPU machine, recorded as such: one rank has no process
    group, so NCCL is not exercised there), against the one-process run on the same device. Dry run:
    the same on the CPU with gloo over 2 ranks, STO-3G water, one thread per process."""
    import torch

    dry, xyz = spec["dry"], str(ROOT / "inputs" / "water.xyz")
    ngpu = 0 if dry else torch.cuda.device_count()
    if not dry and ngpu == 0:
        return "fail", "no CUDA GPU visible to torch", {"ngpu": 0}
    ranks, device, want = (2, "cpu", "gloo") if dry else (min(2, ngpu), "cuda", "nccl")
    tmp = Path(spec["tmp"])
    args = ["run", xyz, "--device", device, "-q"] + (["--basis", "sto-3g", "--cpu-blas", "torch"] if dry else [])
    one_cmd = [sys.executable, "-m", "dfmp2", *args, "--json", str(tmp / "nccl_one.json")]
    many_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    many_cmd += ["-m", "dfmp2", *args, "--json", str(tmp / "nccl_ranks.json")]
    env = {**os.environ, **({"OMP_NUM_THREADS": "1"} if dry else {})}  # equal threads per process
    res = {"ngpu": ngpu, "world_size": ranks, "device": device, "expected_backend": want}
    res["commands"] = [" ".join(c[1:]).replace(str(ROOT) + "/", "") for c in (one_cmd, many_cmd)]
    if ranks == 1:
        res["note"] = "one GPU: ran 1 rank (no process group: NCCL not exercised); 2 ranks need 2 GPUs"
    timeout = max(spec["budget"] / 2 - 5, 10)
    for key, cmd in (("one_process", one_cmd), ("ranks", many_cmd)):
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)
        res[f"{key}_s"] = time.perf_counter() - t0
        out = tmp / ("nccl_one.json" if key == "one_process" else "nccl_ranks.json")
        if p.returncode != 0 or not out.exists():
            return "fail", f"{key}: exit {p.returncode}: {_last(p.stderr)}", {**res, "stderr_tail": p.stderr[-1500:]}
        doc = json.loads(out.read_text())
        res[f"energies_{key}"] = {k: doc["energies"][k] for k in ("e_hf", "e_corr_os", "e_corr_ss", "e_mp2")}
        dist = doc["ran"].get("distributed") or {}
    res["comm_backend"] = dist.get("backend")
    res["devices"], res["dist_scf"] = dist.get("devices"), dist.get("scf")
    res["world_size_recorded"] = dist.get("world_size", 1)
    one, many = res["energies_one_process"], res["energies_ranks"]
    res["abs_d"] = {k: abs(many[k] - one[k]) for k in one}
    res["bitwise"] = {k: many[k] == one[k] for k in one}
    worst = max(res["abs_d"].values())
    problems = [f"|ΔE| {worst:.1e} Eh over {E_RANKS_TOL:g}"] if worst > E_RANKS_TOL else []
    if res["world_size_recorded"] != ranks:
        problems.append(f"the result records world size {res['world_size_recorded']}, not {ranks}")
    if ranks > 1 and res["comm_backend"] != want:
        problems.append(f"comm backend {res['comm_backend']}, not {want}")
    said = f"{ranks} rank{'s' if ranks > 1 else ''} ({res['comm_backend'] or 'no process group'}) vs one process"
    said += f": max |ΔE| {worst:.1e} Eh" + (f"; {res['note']}" if ranks == 1 else "")
    return ("fail" if problems else "pass"), "; ".join(problems) or said, res


SCF_STAGES = ("scf_integrals", "scf_fit", "scf_guess", "scf")  # our DF-RHF's stages in a run's timings


def step_ours(spec):
    """Our whole ``dfmp2 run`` on the device after a warm-up on water, timed in the warm process;
    its DF-RHF seconds are the run's SCF stages (SCF_STAGES: the plan's layout, blocks and
    precision, as a user's run has them; a bare ``driver.run_scf`` would run its bare defaults)."""
    from dfmp2.interfaces.api import run
    from dfmp2.options import RunOptions

    dev, xyz = spec["device"], spec["xyz"][mol_key(spec["step"])]
    run(str(ROOT / "inputs/water.xyz"), RunOptions(device=dev))  # warm-up: compile, allocators, fp32 probe
    t0 = time.perf_counter()
    r = run(xyz, RunOptions(device=dev))
    t_whole = time.perf_counter() - t0
    t_scf = sum(r.timings.get(k, 0.0) for k in SCF_STAGES)
    res = {
        "device": dev,
        "molecule": xyz,
        "dfrhf_s": t_scf,
        "dfrhf_iterations": r.ran["scf"]["iterations"],
        "e_hf_dfrhf": r.e_hf,
        "scf_precision": r.ran["scf"].get("cycle_precision"),
        "jk_factor": r.ran["scf"].get("jk_factor"),
        "whole_s": t_whole,
        "e_hf": r.e_hf,
        "e_corr": r.e_corr,
        "e_mp2": r.e_mp2,
        "timings": r.timings,
        "shapes": {"nbasis": r.nbasis, "nocc": r.nocc, "nvir": r.nvir, "naux": r.naux},
        "pair_flops": r.nocc * (r.nocc + 1) / 2 * 2.0 * r.nvir**2 * r.naux,
        "kernels": r.ran.get("kernels"),
        "engine": r.ran.get("engine"),
        "integrals": r.ran.get("integrals"),
        "jk_factor_s": {
            (r.ran.get("scf") or {}).get("integrals", {}).get("engine", "?"): r.timings.get("scf_integrals")
        },
    }
    said = f"DF-RHF {t_scf:.2f} s, whole run {t_whole:.2f} s, E_MP2 {r.e_mp2:.10f}"
    if (r.ran.get("integrals") or {}).get("engine") == "gpu4pyscf":
        # auto keeps libcint for the JK factor (integrals.select_jk_engine): time gpu4pyscf's JK
        # factor too, one call per fit group, so the next session can decide 'auto' on numbers
        g = run(xyz, RunOptions(device=dev, integrals="gpu4pyscf"))
        res["jk_factor_s"]["gpu4pyscf"] = g.timings.get("scf_integrals")
        res["e_mp2_all_gpu4pyscf"] = g.e_mp2
        res["timings_all_gpu4pyscf"] = g.timings
        said += "; JK factor " + ", ".join(f"{k} {v:.2f} s" for k, v in res["jk_factor_s"].items())
    return "pass", said, res


def step_profile(spec):
    """``dfmp2 run --profile`` of the molecule after a warm-up on water (Triton's compiles and the
    allocators outside it): where the time and bytes go, per stage (wall, host CPU, device busy
    seconds, MB host->device and back, ops, host waits), per part of the SCF's cycles, the top
    kernels (dfmp2.timing.Profile). A step of its own: the parts are synchronised (a slower run),
    and a step over its budget loses only this record."""
    from dfmp2.interfaces.api import run
    from dfmp2.options import RunOptions

    dev, xyz = spec["device"], spec["xyz"][mol_key(spec["step"])]
    run(str(ROOT / "inputs/water.xyz"), RunOptions(device=dev))
    r = run(xyz, RunOptions(device=dev), profile=True)
    p = r.profile
    res = {"device": dev, "molecule": xyz, "wall_s": r.wall_s, "e_mp2": r.e_mp2, "timings": r.timings, "profile": p}
    if mol_key(spec["step"]) == "h2o_16":  # and the gradient stage's (issue 59: the gradient on the GPU)
        from dfmp2.drivers.gradient import run_gradient
        from dfmp2.io.xyz import read_xyz

        g = run_gradient(read_xyz(xyz), RunOptions(device=dev), profile=True)
        res["gradient_wall_s"], res["gradient_profile"] = g.wall_s, g.profile
    cycles = p["scf_cycles"] or 1
    parts = ", ".join(f"{k} {v['wall_s'] / cycles * 1e3:.1f}" for k, v in p["scf_regions"].items())
    moved = sum(v["h2d_bytes"] + v["d2h_bytes"] for v in p["stages"].values())
    top = p["top_kernels"][0]["name"][:40] if p["top_kernels"] else "none"
    return "pass", f"wall {r.wall_s:.2f} s; SCF ms/cycle: {parts}; {moved / 1e6:.0f} MB moved; top: {top}", res


def profile_lines(doc: dict) -> list[str]:
    """The markdown of the profile steps: per stage, per SCF part (ms a cycle), the top kernels."""
    out = []
    for s in doc["steps"]:
        result = (s.get("result") or {}) if s["name"].startswith("profile_") else {}
        for what, p in (("", result.get("profile")), (" (the gradient stage)", result.get("gradient_profile"))):
            if p:
                out += _profile_md(s["name"] + what, p)
    return out


def _profile_md(name: str, p: dict) -> list[str]:
    """One profile's markdown (Profile.report's record)."""
    out = []
    f = lambda v, d=3: "—" if v is None else f"{v:.{d}f}"
    out += ["", f"## {name}: --profile on {p['device']} (wall {p['wall_s']:.2f} s)", ""]
    out += [f"Outside the stages {p['outside_stages_s']:.2f} s: " + json.dumps(p["set_up"]), ""]
    if p.get("note"):
        out += [f"**{p['note']}**", ""]
    out += [
        "| stage | wall s | host CPU s | device busy s | H→D MB | D→H MB | ops | waits |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, v in p["stages"].items():
        out.append(
            f"| {k} | {f(v['wall_s'])} | {f(v['host_cpu_s'])} | {f(v['device_busy_s'])} | "
            f"{v['h2d_bytes'] / 1e6:.1f} | {v['d2h_bytes'] / 1e6:.1f} | {v['ops']} | {v['host_waits']} |"
        )
    cyc = p["scf_cycles"] or 1
    if p["scf_regions"]:  # the energy run's (a gradient stage has none)
        out += ["", f"SCF parts over {p['scf_cycles']} cycles (each synchronised), ms a cycle:", ""]
        out += ["| part | calls | wall | device busy | H→D MB | D→H MB | waits |", "|---|---|---|---|---|---|---|"]
    for k, v in p["scf_regions"].items():
        busy = None if v["device_busy_s"] is None else v["device_busy_s"] / cyc * 1e3
        out.append(
            f"| {k} | {v['calls']} | {v['wall_s'] / cyc * 1e3:.1f} | {f(busy, 1)} | "
            f"{v['h2d_bytes'] / 1e6:.1f} | {v['d2h_bytes'] / 1e6:.1f} | {v['host_waits']} |"
        )
    out += ["", f"Top kernels by {p['top_kernels_by']}:", "", "| kernel | calls | s |", "|---|---|---|"]
    out += [f"| `{_cell(r['name'][:90])}` | {r['calls']} | {r['seconds']:.3f} |" for r in p["top_kernels"][:10]]
    return out


def step_grad(spec):
    """Issue 59's gradient check: after a warm-up on water (energy and gradient: compiles,
    allocators), our (H2O)16 energy run and gradient run (energy + stage) on the device, timed each;
    the gradient (natm, 3) Eh/bohr against our stored CPU gradient (GRAD_REFERENCE: same molecule,
    same options, checked) within GRAD_TOL. Dry run: water on the CPU against a second CPU run in
    this step (the code path, not a device-vs-CPU check). 'fail' when the gradients differ or no
    reference applies; the cost (gradient / energy, GRAD_COST) is a figure, not a failure."""
    from dfmp2.drivers.gradient import run_gradient
    from dfmp2.interfaces.api import run
    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions

    dev, xyz, water = spec["device"], spec["xyz"]["h2o_16"], str(ROOT / "inputs/water.xyz")
    run(water, RunOptions(device=dev))  # warm-up: compile, allocators
    run_gradient(read_xyz(water), RunOptions(device=dev))  # and the gradient stage's kernels
    e, g, t_energy, t_grad = timed_energy_and_gradient(xyz, dev)
    doc = g.to_dict()
    res = {
        "device": dev,
        "molecule": xyz,
        "energy_s": t_energy,
        "gradient_s": t_grad,
        "gradient_stage_s": g.wall_s,
        "gradient_over_energy": t_grad / t_energy,
        "cost_bound": GRAD_COST,
        "e_mp2": e.e_mp2,
        "e_mp2_gradient_run": doc["energies"]["e_mp2"],
        "options": {k: doc.get(k) for k in GRAD_OPTIONS} | {"method": g.method, "precision": doc["ran"]["precision"]},
        "gradient_timings": doc["gradient"].get("timings"),
        "gradient_ran": {k: doc["gradient"]["ran"].get(k) for k in ("device", "precision", "plan")},
        "gradient": g.gradient.tolist(),
    }
    res["uhf"] = uhf_gradient_check(dev, spec["dry"])
    if spec["dry"]:
        cpu = run_gradient(read_xyz(xyz), RunOptions(device="cpu"))
        ref = {
            "gradient": cpu.gradient.tolist(),
            "options": res["options"],
            "source": "DRY RUN: a second CPU run of the same molecule in this step, not a stored reference",
        }
    else:
        ref = grad_reference(xyz)
    return grad_verdict(res, ref)


def timed_energy_and_gradient(xyz: str, dev: str) -> tuple:
    """(energy Result, GradientResult, energy run s, gradient run s) of ``xyz`` on ``dev`` with the
    default options, each run timed alone in this (warm) process."""
    from dfmp2.drivers.gradient import run_gradient
    from dfmp2.interfaces.api import run
    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions

    t0 = time.perf_counter()
    e = run(xyz, RunOptions(device=dev))
    t_energy = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = run_gradient(read_xyz(xyz), RunOptions(device=dev))
    return e, g, t_energy, time.perf_counter() - t0


UHF_GRAD_MOLECULE = {"real": "inputs/open_shell/glycyl.xyz", "dry": "inputs/open_shell/water_cation.xyz"}


def uhf_gradient_check(dev: str, dry: bool) -> dict:
    """Issue 59's UHF gradient on the device: an open shell's (glycyl radical, UHF; the dry run's
    water cation) energy run and gradient run timed on ``dev`` (after step_grad's warm-up), the
    gradient against the CPU's of the same molecule and options made here (GRAD_TOL, Eh/bohr)."""
    from dfmp2.drivers.gradient import run_gradient
    from dfmp2.io.xyz import read_xyz
    from dfmp2.options import RunOptions

    xyz = str(ROOT / UHF_GRAD_MOLECULE["dry" if dry else "real"])
    run_gradient(read_xyz(ROOT / UHF_GRAD_MOLECULE["dry"]), RunOptions(device=dev))  # UHF kernels warmed
    _, g, t_energy, t_grad = timed_energy_and_gradient(xyz, dev)
    cpu = run_gradient(read_xyz(xyz), RunOptions(device="cpu"))
    return {
        "molecule": xyz,
        "multiplicity": g.to_dict().get("multiplicity"),
        "energy_s": t_energy,
        "gradient_s": t_grad,
        "gradient_over_energy": t_grad / t_energy,
        "against": "our CPU gradient of the same molecule and options, made in this step",
        "agreement": compare_gradient(g.gradient.tolist(), cpu.gradient.tolist()),
    }


def grad_verdict(res: dict, ref: dict) -> tuple:
    """The gradient step's (status, reason, result): ``res`` (step_grad's figures, 'gradient' (natm, 3)
    Eh/bohr, 'options') against ``ref`` (grad_reference()'s: 'gradient', 'options', 'source'; or
    'reason' when none applies: 'fail')."""
    res["reference"] = ref.get("source") or ref.get("reason")
    cost = f"gradient / energy {res['gradient_over_energy']:.2f} (bound {GRAD_COST:g})"
    if "gradient" not in ref:
        return "fail", f"no CPU gradient to compare with: {ref.get('reason')}; {cost}", res
    differ = {k: (v, ref["options"].get(k)) for k, v in res["options"].items() if ref["options"].get(k) != v}
    if differ:
        res["options_differ"] = differ
        return "fail", f"the reference ran other options: {differ}; {cost}", res
    res["agreement"] = compare_gradient(res["gradient"], ref["gradient"])
    d = res["agreement"]["max_abs_d"]
    said = f"max |Δg| {d:.1e} Eh/bohr (bound {GRAD_TOL:g})" if d is not None else res["agreement"]["reason"]
    uhf = (res.get("uhf") or {}).get("agreement")
    if uhf is not None:
        said += f"; UHF max |Δg| {uhf['max_abs_d']:.1e}, gradient / energy {res['uhf']['gradient_over_energy']:.2f}"
    met = res["agreement"]["met"] and (uhf is None or uhf["met"])
    return ("pass" if met else "fail"), f"{said}; {cost}", res


def compare_gradient(grad, reference, tol: float = GRAD_TOL) -> dict:
    """max |g - g_ref| in Eh/bohr of two (natm, 3) gradients against ``tol``: {'max_abs_d',
    'bound', 'met'}; shapes that differ (or not (natm, 3)): max_abs_d None, met False, 'reason'. A NaN
    is not met."""
    import numpy as np

    g, r = np.asarray(grad, dtype=float), np.asarray(reference, dtype=float)
    if g.shape != r.shape or g.ndim != 2 or g.shape[1] != 3:
        return {"max_abs_d": None, "bound": tol, "met": False, "reason": f"shape {g.shape} vs reference {r.shape}"}
    d = float(np.abs(g - r).max())
    return {"max_abs_d": d, "bound": tol, "met": bool(d <= tol)}


def grad_reference(xyz, path=GRAD_REFERENCE) -> dict:
    """Our stored CPU gradient for ``xyz`` (GRAD_REFERENCE: 'gradient' (natm, 3) Eh/bohr, 'options',
    'e_mp2', ...; 'source' the file), or {'reason'} when the file is unreadable or was computed on
    another geometry (its xyz_sha256)."""
    import hashlib

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        return {"reason": f"{path} not read ({type(e).__name__}: {_one(e)})"}
    if hashlib.sha256(Path(xyz).read_bytes()).hexdigest() != doc.get("xyz_sha256"):
        return {"reason": f"{Path(path).name} was computed on another geometry than {xyz}"}
    return {**doc, "source": str(Path(path).relative_to(ROOT) if Path(path).is_relative_to(ROOT) else path)}


def make_grad_reference(result_json, out=GRAD_REFERENCE) -> dict:
    """GRAD_REFERENCE from a ``dfmp2 gradient XYZ --device cpu --json RESULT_JSON`` document (the
    run made once, on the CPU, with the default options): the gradient (natm, 3) Eh/bohr, E_HF and
    E_MP2 (Eh), the options, what ran, versions, machine, date and the XYZ's sha256."""
    import hashlib

    d = json.loads(Path(result_json).read_text())
    xyz = Path(d["molecule"])
    rel = xyz.resolve().relative_to(ROOT) if xyz.resolve().is_relative_to(ROOT) else xyz
    ref = {
        "what": "our CPU DF-MP2 gradient: the reference of scripts/gpu_acceptance.py's grad_h2o_16 step "
        f"(the device's gradient within {GRAD_TOL:g} Eh/bohr of it)",
        "command": f"dfmp2 gradient {rel} --device cpu --json RESULT (default options otherwise)",
        "molecule": str(rel),
        "xyz_sha256": hashlib.sha256(xyz.read_bytes()).hexdigest(),
        "natm": d["natm"],
        "units": {"gradient": "hartree/bohr", "energies": "hartree", "walls": "s"},
        "gradient": d["gradient"]["gradient"],
        "e_hf": d["energies"]["e_hf"],
        "e_mp2": d["energies"]["e_mp2"],
        "options": {k: d.get(k) for k in GRAD_OPTIONS}
        | {"method": d["gradient"]["method"], "precision": d["ran"]["precision"]},
        "memory_limit_mb": d["memory"]["limit_mb"],
        "ran": {"device": d["ran"]["device"], "threads": d["ran"].get("threads"), "plan": d["gradient"]["ran"]["plan"]},
        "zvector": d["gradient"].get("zvector"),
        "energy_run_wall_s": d["wall_s"],
        "gradient_stage_s": d["gradient"]["wall_s"],
        "versions": d["versions"],
        "dfmp2_commit": _commit(),
        "machine": _cpu(),
        "date": d["date"],
        "same_molecule_other_runs": _other_gradients(d["gradient"]["gradient"], xyz.name, out),
    }
    Path(out).write_text(json.dumps(ref, indent=1) + "\n")
    return ref


def _other_gradients(gradient, xyz_name: str, out) -> dict:
    """max |Δg| (Eh/bohr) of ``gradient`` against each committed result in scripts/results/ that holds
    a whole gradient of the same molecule (other memory plans, ranks): how far the plans differ."""
    found = {}
    for p in sorted((ROOT / "scripts" / "results").glob("gradient_*.json")):
        try:
            d = json.loads(p.read_text())
            if not isinstance(d, dict) or p.resolve() == Path(out).resolve():
                continue
            if Path(str(d.get("molecule"))).name != xyz_name:
                continue
            found[p.name] = compare_gradient(d["gradient"]["gradient"], gradient)["max_abs_d"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def step_gpu4pyscf(spec):
    try:
        import cupy
        import gpu4pyscf
        from gpu4pyscf import scf as gscf
        from gpu4pyscf.mp import dfmp2 as gdfmp2
    except Exception as e:  # ImportError, or a CUDA library that does not load
        missing = getattr(e, "name", None) == "gpu4pyscf"
        return (
            "skipped",
            (
                f"gpu4pyscf not importable ({type(e).__name__}: {_one(e)})"
                + (
                    "; it is too large to travel with PySCF in one call: make the two calls of "
                    "scripts/gpu_acceptance.py's docstring"
                    if missing
                    else ""
                )
            ),
            {},
        )
    if spec["dry"]:
        return "skipped", "dry run on CPU: gpu4pyscf needs a GPU", {}
    from dfmp2.df import basis
    from dfmp2.io import molecule
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf import pyscf_scf

    def one(xyz):
        mol = molecule.build_molecule(read_xyz(xyz), "cc-pvdz")
        mf = gscf.RHF(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
        mf.conv_tol, mf.conv_tol_grad, mf.verbose = pyscf_scf.SCF_CONV_TOL, pyscf_scf.SCF_CONV_TOL_GRAD, 0
        sync = cupy.cuda.Device().synchronize
        t0 = time.perf_counter()
        mf.kernel()
        sync()
        t1 = time.perf_counter()
        pt = gdfmp2.DFMP2(mf, auxbasis=basis.mp2_auxbasis(mol))
        pt.verbose = 0
        pt.kernel()
        sync()
        t2 = time.perf_counter()
        return {
            "dfrhf_s": t1 - t0,
            "mp2_s": t2 - t1,
            "whole_s": t2 - t0,
            "converged": bool(mf.converged),
            "e_hf": float(mf.e_tot),
            "e_corr": float(pt.e_corr),
            "e_mp2": float(mf.e_tot) + float(pt.e_corr),
        }

    one(str(ROOT / "inputs/water.xyz"))  # warm-up: JIT, pools
    res = {
        "molecule": spec["xyz"][mol_key(spec["step"])],
        "gpu4pyscf": gpu4pyscf.__version__,
        **one(spec["xyz"][mol_key(spec["step"])]),
    }
    if not res["converged"]:
        return "fail", "gpu4pyscf DF-RHF did not converge", res
    return "pass", f"DF-RHF {res['dfrhf_s']:.2f} s, whole {res['whole_s']:.2f} s, E_MP2 {res['e_mp2']:.10f}", res


def step_pyscf(spec):
    from dfmp2.benchmarks import fair_baseline as fb

    xyz = spec["xyz"][mol_key(spec["step"])]
    runs = max(1, fb.planned_runs(once_when_same=True))  # the step's budget shared by PySCF's settings
    base = fb.pyscf_baseline(
        ["whole"],
        xyz,
        timeout=max(spec["budget"] / runs - 5, 5),
        peak_sizes=[256] if spec["dry"] else fb.CPU_PEAK_SIZES,
        once_when_same=True,
    )
    if base["best"] is None:
        return "fail", "; ".join(f"{s}: {r['error']}" for s, r in base["runs"].items() if "error" in r), base
    w = base["tasks"]["whole"]
    errs = [f"{s}: {r['error']}" for s, r in base["runs"].items() if "error" in r]
    res = {
        "molecule": xyz,
        **{k: w[k] for k in ("seconds", "scf_s", "mp2_s", "e_hf", "e_corr", "e_mp2")},
        "baseline": base,
    }
    if errs:  # the fastest is only known when every setting ran
        return "fail", "one BLAS setting did not finish: " + "; ".join(errs), res
    said = f"fastest setting {base['best']} of {runs} runs" if runs > 1 else "one run (one BLAS setting)"
    return "pass", f"{said}: whole {w['seconds']:.2f} s, E_MP2 {w['e_mp2']:.10f}", res


def steps_for(only=None) -> list[str]:
    """The step names in the order they run (the GPU steps first, PySCF's CPU steps last): those in
    ``only``, or without it the default run's (all but NAMED_STEPS)."""
    return [n for n in ORDER if n in only] if only else [n for n in ORDER if n not in NAMED_STEPS]


def step_caps(names: list[str], total_s: float, how: str, dry: bool) -> dict:
    """Each step's cap in seconds (the runner also cuts it to what is left of ``total_s``). ``how``:
    'default' (the default run): its BUDGET_S, 3x in a dry run (a busy CPU); 'preset': its BUDGET_S
    scaled so that the preset's steps fill ``total_s`` together; 'steps' (chosen by --steps): all
    that is left."""
    if how == "preset":
        base = {**BUDGET_S, **PRESET_BUDGET_S}
        scale = total_s / sum(base[n] for n in names)
        return {n: base[n] * scale for n in names}
    if how == "steps":
        return {n: float("inf") for n in names}
    return {n: BUDGET_S[n] * (3 if dry else 1) for n in names}


def child(name: str, spec: dict) -> tuple:
    if spec.get("fail_step") == name:
        raise RuntimeError("injected failure (--fail-step)")
    if spec.get("fail_step") == f"{name}:hang":
        time.sleep(3600)
    kind = name if name in ("cuda_tests", "pair_peak", "run_compare", "nccl_torchrun") else name.rsplit("_h2o_", 1)[0]
    return {
        "cuda_tests": step_cuda_tests,
        "pair_peak": step_pair_peak,
        "run_compare": step_run_compare,
        "nccl_torchrun": step_nccl_torchrun,
        "ours": step_ours,
        "gpu4pyscf": step_gpu4pyscf,
        "pyscf": step_pyscf,
        "grad": step_grad,
        "profile": step_profile,
    }[kind]({**spec, "step": name})


# ------------------------------------------------------------------------------ the step runner
def run_step(name: str, spec: dict, budget: float) -> dict:
    """Run one step in its own process group; kill the group when it outlives ``budget`` seconds."""
    rec = {"name": name, "budget_s": round(budget, 1)}
    if budget < 5:
        return {**rec, "status": "fail", "reason": "no time left in the total budget", "seconds": 0.0}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if spec["dry"]:
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--step",
        name,
        "--spec",
        json.dumps({**spec, "budget": budget}),
    ]
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, start_new_session=True
    )
    try:
        out, err = p.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return {
            **rec,
            "status": "fail",
            "reason": f"over its budget of {budget:.0f} s (killed)",
            "seconds": time.perf_counter() - t0,
            "stderr_tail": err[-1500:],
        }
    rec["seconds"] = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith(MARK)]
    if not lines:
        return {**rec, "status": "fail", "reason": f"exit {p.returncode}: {_last(err)}", "stderr_tail": err[-1500:]}
    status, reason, result = json.loads(lines[-1][len(MARK) :])
    return {**rec, "status": status, "reason": reason, "result": result}


def stored_references(path=REFERENCE) -> dict:
    """PySCF's stored CPU energies per molecule key: {key: {'e_hf', 'e_mp2', ...}} for the entries that
    have both numbers and whose XYZ file still has the recorded sha256; {key: {'reason': ...}} for the
    others (pending, or the geometry changed), or for every molecule when the file is unreadable."""
    import hashlib

    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:  # after the steps ran: say so in the checks, do not lose the run
        return {k: {"reason": f"stored references not read ({type(e).__name__}: {_one(e)})"} for k in WATERS}
    out = {}
    for key, e in doc.get("molecules", {}).items():
        if e.get("status") == "pending" or e.get("e_hf") is None or e.get("e_mp2") is None:
            out[key] = {"reason": f"no stored reference for {key} ({e.get('status') or 'E_HF or E_MP2 missing'})"}
            continue
        xyz = ROOT / e["xyz"]
        if e.get("xyz_sha256") and (
            not xyz.exists() or hashlib.sha256(xyz.read_bytes()).hexdigest() != e["xyz_sha256"]
        ):
            out[key] = {"reason": f"stored reference for {key}: {e['xyz']} is not the geometry it was computed on"}
            continue
        out[key] = {**e, "pyscf": doc.get("pyscf"), "reference_file": str(path)}
    return out


def _agree(molecule: str, who: str, against: str, r: dict, ref: dict) -> dict:
    d_hf, d_mp2 = abs(r["e_hf"] - ref["e_hf"]), abs(r["e_mp2"] - ref["e_mp2"])
    return {
        "molecule": molecule,
        "who": who,
        "against": against,
        "abs_d_e_hf": d_hf,
        "abs_d_e_mp2": d_mp2,
        "passed": d_hf <= E_TOL and d_mp2 <= E_TOL,
        "reference": {k: ref.get(k) for k in ("e_hf", "e_mp2", "source", "date") if ref.get(k) is not None},
    }


def checks(steps: dict, refs: dict | None = None) -> dict:
    """Energies against independent codes, and speed ratios, from the steps that ran. Per molecule:
    ours and gpu4pyscf against PySCF of this run where its step has energies, else against PySCF's
    stored CPU reference (``refs``, from stored_references(); none in a dry run, whose molecules
    differ); and ours against gpu4pyscf whenever both passed. Never against our own numbers."""
    agree, speed, refs = [], [], refs or {}

    def res(name):
        s = steps.get(name)
        return s["result"] if s and s.get("status") == "pass" else None

    def energies(name):  # PySCF with one BLAS setting over its budget: its energies still count
        s = steps.get(name)
        return s["result"] if s and s.get("result") and "e_mp2" in s["result"] else None

    peak = (res("pair_peak") or {}).get("dgemm_peak_tflops")
    for m in ("h2o_16", "h2o_32"):
        ours, g4p, ps = res(f"ours_{m}"), res(f"gpu4pyscf_{m}"), res(f"pyscf_{m}")
        ps_e = energies(f"pyscf_{m}")
        stored = refs.get(m) if refs.get(m, {}).get("e_mp2") is not None else None
        ref, against = (ps_e, LIVE_PYSCF) if ps_e else (stored, STORED_PYSCF) if stored else (None, None)
        why = f"PySCF did {'not pass' if f'pyscf_{m}' in steps else 'not run'}; " + (
            refs.get(m, {}).get("reason") or f"no stored reference for {m}"
        )
        for who, r in (("ours", ours), ("gpu4pyscf", g4p)):
            if r and ref:
                agree.append(_agree(m, who, against, r, ref))
            else:
                agree.append(
                    {
                        "molecule": m,
                        "who": who,
                        "against": against or "PySCF",
                        "passed": None,
                        "reason": f"not compared: {who} did not pass" if ref else f"not compared: {why}",
                    }
                )
        if ours and g4p:
            agree.append(_agree(m, "ours", GPU4PYSCF, ours, g4p))
        else:
            agree.append(
                {
                    "molecule": m,
                    "who": "ours",
                    "against": GPU4PYSCF,
                    "passed": None,
                    "reason": "not compared: "
                    + " and ".join(w for w, r in (("ours", ours), ("gpu4pyscf", g4p)) if not r)
                    + " did not pass",
                }
            )
        if ours:
            row = {"molecule": m, "ours_whole_s": ours["whole_s"], "ours_dfrhf_s": ours["dfrhf_s"]}
            if ps_e and not ps:
                row["pyscf_setting"] = "not compared: only one BLAS setting finished"
            if ps:
                row.update(
                    pyscf_whole_s=ps["seconds"],
                    pyscf_setting=ps["baseline"]["best"]
                    + (", run once" if any("same_as" in r for r in ps["baseline"]["runs"].values()) else ""),
                    pyscf_over_ours_whole=ps["seconds"] / ours["whole_s"],
                    pyscf_over_ours_dfrhf=ps["scf_s"] / ours["dfrhf_s"],
                )
            if g4p:
                row.update(
                    gpu4pyscf_whole_s=g4p["whole_s"],
                    gpu4pyscf_over_ours_whole=g4p["whole_s"] / ours["whole_s"],
                    gpu4pyscf_over_ours_dfrhf=g4p["dfrhf_s"] / ours["dfrhf_s"],
                )
            pair_s = ours["timings"].get("pair")
            if pair_s and peak:
                row["pair_step_pct_of_dgemm_peak"] = 100.0 * ours["pair_flops"] / pair_s / (peak * 1e12)
            speed.append(row)
    return {"agreement": agree, "speed": speed, "e_tol": E_TOL, "stored_reference": str(REFERENCE.relative_to(ROOT))}


# ------------------------------------------------------------------------ issue 59's summary
def stored_cpu_energies(root=ROOT) -> dict:
    """Our own CPU E_MP2 (Eh) of (H2O)16 and (H2O)32 from the committed records (CPU_ENERGIES):
    {key: {'e_mp2', 'source', 'how', 'date', 'machine'}}, or {key: {'reason'}} when a record is
    missing, unreadable, of another molecule or basis, or lacks the number."""
    out = {}
    for key, (rel, how) in CPU_ENERGIES.items():
        try:
            doc = json.loads((Path(root) / rel).read_text())
            if doc["basis"] != "cc-pvdz":
                raise ValueError(f"basis {doc['basis']}, not cc-pvdz")
            if key == "h2o_16":
                if not doc["molecule"].endswith("h2o_16.xyz"):
                    raise ValueError(f"molecule {doc['molecule']}")
                e, date, machine = doc["e_mp2"], doc["date"], doc["machine"]["cpu"]
            else:
                row = next(r for r in doc["rows"] if r["n"] == int(key[4:]))
                e, date, machine = row["ours"]["e_hf"] + row["ours"]["e_corr"], row["date"], doc["machine"]["cpu"]
        except (OSError, ValueError, KeyError, TypeError, StopIteration) as err:
            out[key] = {"reason": f"our CPU energy not read from {rel} ({type(err).__name__}: {_one(err)})"}
            continue
        out[key] = {"e_mp2": float(e), "source": rel, "how": how, "date": date, "machine": machine}
    return out


def _met(value, bound, below=True):
    """True/False for ``value`` against ``bound`` (at most, or with ``below`` False at least);
    None when the value is missing."""
    if value is None:
        return None
    return bool(value <= bound) if below else bool(value >= bound)


def _passed(steps: dict, name: str):
    """(result, None) of a step that passed, else (None, why): not run, or its status and reason."""
    s = steps.get(name)
    if s is None:
        return None, f"{name} not run in this call"
    if s.get("status") != "pass":
        return None, f"{name} {s.get('status')}: {s.get('reason')}"
    return s.get("result") or {}, None


def _molecule_summary(key: str, steps: dict, cpu: dict) -> dict:
    """Issue 59's figures of one molecule: walls (s), E_MP2 (Eh), the ratio and |ΔE| with their
    bounds and 'met' (None where a side is missing; 'missing' says why)."""
    ours, why_o = _passed(steps, f"ours_{key}")
    g4p, why_g = _passed(steps, f"gpu4pyscf_{key}")
    o_w, g_w = (ours or {}).get("whole_s"), (g4p or {}).get("whole_s")
    o_e, g_e, c_e = (ours or {}).get("e_mp2"), (g4p or {}).get("e_mp2"), cpu.get("e_mp2")
    ratio = o_w / g_w if o_w is not None and g_w else None
    d_g = abs(o_e - g_e) if o_e is not None and g_e is not None else None
    d_c = abs(o_e - c_e) if o_e is not None and c_e is not None else None
    missing = [w for w in (why_o, why_g) if w] + ([cpu["reason"]] if "reason" in cpu else [])
    prof, why_p = _passed(steps, f"profile_{key}")
    if why_p:
        missing.append(why_p)
    p = (prof or {}).get("profile")
    keep = ("wall_s", "device_busy_s", "h2d_bytes", "d2h_bytes", "host_waits")
    return {
        "molecule_run": (ours or g4p or {}).get("molecule"),
        "ours_wall_s": o_w,
        "gpu4pyscf_wall_s": g_w,
        "ours_e_mp2": o_e,
        "gpu4pyscf_e_mp2": g_e,
        "ours_over_gpu4pyscf": ratio,
        "bound": ISSUE59_WALL_BOUND[key],
        "met": _met(ratio, ISSUE59_WALL_BOUND[key]),
        "cpu_e_mp2": c_e,
        "cpu_e_mp2_source": cpu.get("source"),
        "abs_d_e_mp2_vs_gpu4pyscf": d_g,
        "abs_d_e_mp2_vs_cpu": d_c,
        "e_bound": CPU_E_TOL,
        "e_met_vs_gpu4pyscf": _met(d_g, CPU_E_TOL),
        "e_met_vs_cpu": _met(d_c, CPU_E_TOL),
        # the profile step's (dfmp2 run --profile): per stage its wall and device busy s, bytes moved
        "stages": {k: {n: v[n] for n in keep} for k, v in p["stages"].items()} if p else None,
        "scf_ms_per_cycle": {k: v["wall_s"] / (p["scf_cycles"] or 1) * 1e3 for k, v in p["scf_regions"].items()}
        if p
        else None,
        "missing": missing,
    }


def _gradient_summary(steps: dict) -> dict:
    """The grad_h2o_16 step's figures: walls (s), their ratio against GRAD_COST, max |Δg| (Eh/bohr)
    against GRAD_TOL; None and met None where the step did not run or did not compare."""
    s = steps.get("grad_h2o_16")
    r = (s or {}).get("result") or {}
    agree = r.get("agreement") or {}
    out = {
        "energy_wall_s": r.get("energy_s"),
        "gradient_wall_s": r.get("gradient_s"),
        "gradient_over_energy": r.get("gradient_over_energy"),
        "cost_bound": GRAD_COST,
        "cost_met": _met(r.get("gradient_over_energy"), GRAD_COST),
        "max_abs_d_gradient": agree.get("max_abs_d"),
        "gradient_bound": GRAD_TOL,
        "gradient_met": agree.get("met"),
        "reference": r.get("reference"),
        "step_status": (s or {}).get("status"),
        "units": {"walls": "s", "max_abs_d_gradient": "hartree/bohr"},
        "uhf": {  # the open shell's (uhf_gradient_check): device vs CPU, its cost
            k: (r.get("uhf") or {}).get(k) for k in ("molecule", "energy_s", "gradient_s", "gradient_over_energy")
        }
        | {"max_abs_d_gradient": ((r.get("uhf") or {}).get("agreement") or {}).get("max_abs_d")},
    }
    if s is None:
        out["missing"] = "grad_h2o_16 not run in this call (--preset issue59 runs it)"
    elif not agree:  # it ran but did not compare: say why
        out["missing"] = f"grad_h2o_16 {s.get('status')}: {s.get('reason')}"
    return out


def summary(doc: dict, source: str | None = None) -> dict:
    """Issue 59's acceptance figures (gpu-acceptance.json) from the whole acceptance document ``doc``
    (main's: meta, steps, cpu_energies): date, gpu, versions, pair_dgemm_share (0-1) against
    PAIR_SHARE_BOUND, per molecule summary's walls and energies against their bounds, the gradient,
    and 'met' over all checks (False if one fails, None if one is missing, else True). Pure: a figure
    whose step did not pass is None with the reason, never invented. ``source``: the document's file."""
    m, steps = doc["meta"], {s["name"]: s for s in doc["steps"]}
    pp, why = _passed(steps, "pair_peak")
    pct = ((pp or {}).get("verdict") or {}).get("fastest_pct_of_gemm_peak")
    share = None if pct is None else pct / 100.0
    cpu = doc.get("cpu_energies") or {}
    mols = {
        k: _molecule_summary(k, steps, cpu.get(k) or {"reason": "no CPU energy recorded"}) for k in ISSUE59_WALL_BOUND
    }
    grad = _gradient_summary(steps)
    pair = {"share": share, "bound": PAIR_SHARE_BOUND, "met": _met(share, PAIR_SHARE_BOUND, below=False)}
    pair |= {
        "path": ((pp or {}).get("verdict") or {}).get("fastest_path"),
        "dgemm_peak_tflops": (pp or {}).get("dgemm_peak_tflops"),
    }
    if share is None:
        pair["missing"] = why or "pair_peak recorded no fastest path"
    checks = [pair["met"], grad["gradient_met"], grad["cost_met"]]
    checks += [v[k] for v in mols.values() for k in ("met", "e_met_vs_gpu4pyscf", "e_met_vs_cpu")]
    keys = ("torch", "torch_cuda", "triton", "gpu4pyscf", "cupy", "pyscf", "dfmp2_commit")
    return {
        "schema": SUMMARY_SCHEMA,
        "issue": 59,
        "dry_run": bool(m.get("dry_run_cpu")),
        "date": m["date"],
        "gpu": m["gpu"].get("name"),
        "versions": {k: m["versions"].get(k) for k in keys} | {"driver": m["gpu"].get("driver")},
        "source": source,
        "pair_dgemm_share": share,
        "pair_dgemm": pair,
        "molecules": mols,
        "gradient": {"molecule": "h2o_16", **grad},
        "met": False if False in checks else None if None in checks else True,
        "units": {"walls": "s", "energies": "hartree", "gradient": "hartree/bohr"},
    }


def summary_lines(s: dict) -> list[str]:
    """The markdown section 'Issue 59 acceptance' of a summary(): one row per check."""
    f = lambda v, fmt: "n/a" if v is None else format(v, fmt)
    yes = lambda v: {True: "yes", False: "**no**", None: "not known"}[v]
    rows = [
        ("pair step / DGEMM peak", f(s["pair_dgemm_share"], ".3f"), f">= {PAIR_SHARE_BOUND:g}", s["pair_dgemm"]["met"])
    ]
    for k, v in s["molecules"].items():
        rows += [
            (
                f"{k}: ours / gpu4pyscf wall",
                f"{f(v['ours_wall_s'], '.2f')} / {f(v['gpu4pyscf_wall_s'], '.2f')} s = {f(v['ours_over_gpu4pyscf'], '.2f')}",
                f"<= {v['bound']:g}",
                v["met"],
            ),
            (
                f"{k}: abs ΔE_MP2 vs gpu4pyscf",
                f(v["abs_d_e_mp2_vs_gpu4pyscf"], ".1e"),
                f"<= {v['e_bound']:g} Eh",
                v["e_met_vs_gpu4pyscf"],
            ),
            (
                f"{k}: abs ΔE_MP2 vs our CPU run",
                f(v["abs_d_e_mp2_vs_cpu"], ".1e"),
                f"<= {v['e_bound']:g} Eh",
                v["e_met_vs_cpu"],
            ),
        ]
    g = s["gradient"]
    rows += [
        (
            "h2o_16 gradient: max abs Δg vs CPU",
            f(g["max_abs_d_gradient"], ".1e"),
            f"<= {g['gradient_bound']:g} Eh/bohr",
            g["gradient_met"],
        ),
        (
            "h2o_16 gradient / energy wall",
            f(g["gradient_over_energy"], ".2f"),
            f"<= {g['cost_bound']:g}",
            g["cost_met"],
        ),
    ]
    missing = [f"{k}: {w}" for k, v in s["molecules"].items() for w in v["missing"]]
    missing += [f"{k}: {v['missing']}" for k, v in (("pair", s["pair_dgemm"]), ("gradient", g)) if v.get("missing")]
    lines = [
        "",
        f"## Issue 59 acceptance{' (DRY RUN ON CPU, NOT GPU NUMBERS)' if s['dry_run'] else ''}: "
        f"all met: {yes(s['met'])}",
        "",
        "| check | value | bound | met |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b} | {c} | {yes(d)} |" for a, b, c, d in rows]
    return lines + (["", "Not known because:", "", *(f"- {_cell(w)}" for w in missing)] if missing else [])


# ------------------------------------------------------------------------------------ metadata
def meta(dry: bool) -> dict:
    import torch

    m = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "dry_run_cpu": dry,
        "label": "DRY RUN ON CPU, NOT GPU NUMBERS" if dry else "GPU acceptance",
        "host": platform.node(),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "command": " ".join(sys.argv),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda},
    }
    from importlib import metadata

    for mod, dists in (
        ("triton", ["triton"]),
        ("pyscf", ["pyscf"]),
        ("numpy", ["numpy"]),
        ("gpu4pyscf", ["gpu4pyscf-cuda13x", "gpu4pyscf-cuda12x", "gpu4pyscf"]),
        ("cupy", ["cupy-cuda13x", "cupy-cuda12x", "cupy"]),
    ):
        found = []
        for d in dists:  # read without importing (no CUDA context in this process)
            try:
                found.append(f"{metadata.version(d)} ({d})" if d != mod else metadata.version(d))
            except metadata.PackageNotFoundError:
                pass
        m["versions"][mod] = ", ".join(found) or "not installed"
    m["versions"]["dfmp2_commit"] = _commit()
    if not dry and torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        m["gpu"] = {
            "name": p.name,
            "compute_capability": f"{p.major}.{p.minor}",
            "memory_gib": round(p.total_memory / 2**30, 1),
        }
        try:
            q = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            m["gpu"]["driver"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, IndexError):
            m["gpu"]["driver"] = None
    else:
        m["gpu"] = {"name": "NONE: DRY RUN ON CPU" if dry else "no CUDA GPU visible to torch"}
    from dfmp2.benchmarks import fair_baseline as fb

    m["blas"] = fb.blas_info()
    return m


def _torchrun_lines(doc: dict) -> list[str]:
    """The markdown section of the nccl_torchrun step: energies of one process and of the ranks."""
    lines = []
    nc = next((s for s in doc["steps"] if s["name"] == "nccl_torchrun" and (s.get("result") or {}).get("abs_d")), None)
    if nc:
        r = nc["result"]
        lines += [
            "",
            f"## torchrun over {r['world_size']} rank(s): comm backend {r['comm_backend'] or 'none (one rank)'}, "
            f"device {r['device']}, {r['ngpu']} GPU(s) visible",
            "",
            *([r["note"], ""] if r.get("note") else []),
            "| energy | one process / Eh | ranks / Eh | abs Δ / Eh | bitwise |",
            "|---|---|---|---|---|",
        ]
        for k, d in r["abs_d"].items():
            one, many = r["energies_one_process"][k], r["energies_ranks"][k]
            lines.append(f"| {k} | {one:.12f} | {many:.12f} | {d:.1e} | {r['bitwise'][k]} |")
    return lines


def _pair_peak_lines(doc: dict) -> list[str]:
    """The markdown section of the pair_peak step: each pair path against the DGEMM peak."""
    lines, f = [], lambda v, p=2: "" if v is None else f"{v:.{p}f}"
    pp = next((s for s in doc["steps"] if s["name"] == "pair_peak" and s.get("result")), None)
    if pp:
        r = pp["result"]
        lines += [
            "",
            f"## Pair step vs DGEMM peak ({r['shape']['nocc']}/{r['shape']['nvir']}/{r['shape']['naux']})",
            "",
            f"DGEMM peak {f(r['dgemm_peak_tflops'])} TFLOP/s (n = {r['dgemm_peak_n']}); fp64 dot: {r['fp64_dot_lowering']}",
            "",
            "| path | median s | GFLOP/s | % of DGEMM |",
            "|---|---|---|---|",
        ]
        for row in r["rows"]:
            lines.append(
                f"| {row['path']} | {f(row['median_s'], 4)} | {f(row['gflops'], 1)} | {f(row['pct_of_gemm_peak'], 1)} |"
                if row.get("gflops")
                else f"| {row['path']} | failed: {_cell(row['error'])} | | |"
            )
    return lines


def markdown(doc: dict) -> str:
    m = doc["meta"]
    banner = (
        [
            "",
            "**DRY RUN ON CPU, NOT GPU NUMBERS: the steps ran on the CPU with the smallest inputs "
            "to test this script.**",
            "",
        ]
        if m["dry_run_cpu"]
        else [""]
    )
    g = m["gpu"]
    lines = [
        f"# GPU acceptance{' (DRY RUN ON CPU)' if m['dry_run_cpu'] else ''}: {g['name']}",
        *banner,
        f"- date: {m['date']}; host {m['host']}, {m['cpu']}, {m['cores']} cores",
        "- GPU: " + ", ".join(f"{k} {v}" for k, v in g.items()),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- command: `{m['command']}`; total budget {doc['total_s']:.0f} s, took {doc['wall_s']:.0f} s",
        f"- result: **{doc['verdict']}**",
        "",
        "| step | status | s (budget) | what it says |",
        "|---|---|---|---|",
    ]
    for s in doc["steps"]:
        lines.append(
            f"| {s['name']} | {s['status']} | {s.get('seconds', 0):.1f} ({s['budget_s']:.0f}) | {_cell(s['reason'])} |"
        )
    failed = [f for s in doc["steps"] for f in (s.get("result") or {}).get("failed", [])]
    if failed:  # the cuda tests that failed, one line each (pytest -rfE)
        lines += ["", "Failed tests:", "", *(f"- `{f}`" for f in failed)]
    lines += summary_lines(summary(doc))
    c = doc["checks"]
    lines += [
        "",
        f"## Energies against independent codes (bound {c['e_tol']:g} Eh)",
        "",
        f"PySCF's stored reference, used where the PySCF step did not pass: {c.get('stored_reference')}",
        "",
        "| molecule | who | against | abs ΔE_HF / Eh | abs ΔE_MP2 / Eh | passed |",
        "|---|---|---|---|---|---|",
    ]
    for a in c["agreement"]:
        lines.append(
            f"| {a['molecule']} | {a['who']} | {a.get('against', 'PySCF')} | {a.get('abs_d_e_hf', float('nan')):.1e} | "
            f"{a.get('abs_d_e_mp2', float('nan')):.1e} | {a['passed'] if a['passed'] is not None else a['reason']} |"
        )
    lines += [
        "",
        "## Speed (PySCF: the fastest of its BLAS settings; as_set and unset run once where they are the same)",
        "",
        "| molecule | ours whole s | ours DF-RHF s | PySCF whole s (setting) | PySCF / ours whole | PySCF / ours DF-RHF "
        "| gpu4pyscf whole s | gpu4pyscf / ours whole | pair step % of DGEMM |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    f = lambda v, p=2: "" if v is None else f"{v:.{p}f}"
    for r in c["speed"]:
        lines.append(
            f"| {r['molecule']} | {f(r['ours_whole_s'])} | {f(r['ours_dfrhf_s'])} | {f(r.get('pyscf_whole_s'))}"
            f" ({r.get('pyscf_setting', '')}) | {f(r.get('pyscf_over_ours_whole'))} | {f(r.get('pyscf_over_ours_dfrhf'))} | "
            f"{f(r.get('gpu4pyscf_whole_s'))} | {f(r.get('gpu4pyscf_over_ours_whole'))} | "
            f"{f(r.get('pair_step_pct_of_dgemm_peak'), 1)} |"
        )
    lines += _torchrun_lines(doc) + _pair_peak_lines(doc) + profile_lines(doc)
    for s in doc["steps"]:
        b = (s.get("result") or {}).get("baseline")
        if b:
            from dfmp2.benchmarks import fair_baseline as fb

            about = fb.markdown_lines(b, m["blas"], b["peaks"])[2:]  # without its heading
            lines += ["", f"### {s['name']}: PySCF's BLAS settings", "", *about]
    if m["dry_run_cpu"]:
        lines += ["", "**DRY RUN ON CPU, NOT GPU NUMBERS.**"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- the wheels
def pip_download(dest, reqs, deps: bool) -> list[str]:
    """One ``pip download`` command into ``dest``: Python 3.12, CPython, manylinux x86-64 (the GPU
    machine's), binary wheels only; ``deps`` False: the named wheels alone."""
    return [
        *[sys.executable, "-m", "pip", "download", "--only-binary=:all:", "--python-version", "3.12"],
        *["--implementation", "cp", *[a for p in PLATFORMS for a in ("--platform", p)], "-d", str(dest)],
        *([] if deps else ["--no-deps"]),
        *reqs,
    ]


def pip_downloads(dest) -> list[list[str]]:
    """The ``pip download`` commands of --prepare-wheels' .whl/: WHEELS without their dependencies
    (numpy, scipy, h5py are on the GPU machine already), then WITH_DEPS with whatever pip says they
    need for Python 3.12 (jsonschema's attrs, jsonschema-specifications, referencing, rpds-py, ...)."""
    return [pip_download(dest, WHEELS, deps=False), pip_download(dest, WITH_DEPS, deps=True)]


def prepare_wheels() -> None:
    """Here, once: download the wheels (Python 3.12, manylinux x86-64) and write the carried folders
    (ignored by git, .gitignore): .whl/ (PySCF, jsonschema and its dependencies, threadpoolctl: the run
    without gpu4pyscf), and .g4a/, .g4b/, ... (those and gpu4pyscf unpacked into one tree, tar.xz, cut
    into pieces of at most PIECE_MIB). Prints each wheel's and each folder's size."""
    import zipfile

    whl = ROOT / ".whl"
    for old in whl.glob("*.whl") if whl.is_dir() else []:  # no stale versions beside the new ones
        old.unlink()
    for cmd in pip_downloads(whl):
        subprocess.run(cmd, check=True)
    for w in sorted(whl.glob("*.whl")):
        print(f"  {w.name}: {w.stat().st_size / 2**20:.2f} MiB")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(pip_download(tmp, [G4P], deps=False), check=True)
        for w in Path(tmp).glob("gpu4pyscf*.whl"):
            print(f"  {w.name}: {w.stat().st_size / 2**20:.2f} MiB")
        site = Path(tmp) / "site"
        for w in [*Path(tmp).glob("gpu4pyscf*.whl"), *whl.glob("*.whl")]:
            with zipfile.ZipFile(w) as z:
                z.extractall(site)
        for so in site.rglob("*.so*"):  # zipfile drops the execute bit
            so.chmod(0o755)
        pack = Path(tmp) / "pack.tar.xz"
        subprocess.run(f"tar -C {site} -cf - . | xz -T0 -9 > {pack}", shell=True, check=True)
        data, piece = pack.read_bytes(), PIECE_MIB * 2**20
        parts = [data[k : k + piece] for k in range(0, len(data), piece)]
        for old in ROOT.glob(".g4?"):
            for f in old.iterdir():
                f.unlink()
        for n, part in enumerate(parts):
            d = ROOT / f".g4{'abcdefgh'[n]}"
            d.mkdir(exist_ok=True)
            (d / f"pack.tar.xz.{n:02d}").write_bytes(part)
            (d / "pack.parts").write_text(f"{len(parts)}\n")
    for d in [whl, *sorted(ROOT.glob(".g4?"))]:
        size = sum(p.stat().st_size for p in d.iterdir() if p.name != "pack.parts")
        print(f"{d.name}: {size / 2**20:.1f} MiB")
        if size > PIECE_MIB * 2**20:  # with the checkout (4.2 MB), over the 64 MiB a call carries
            sys.exit(f"error: {d.name} is {size / 2**20:.1f} MiB, over {PIECE_MIB} MiB")
    print("carry .whl alone (no gpu4pyscf), or stage .g4a ... then carry the last piece; see the docstring")


# ------------------------------------------------------------------------------------- helpers
def _one(e) -> str:
    return " ".join(str(e).split())[:300]


def _last(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[-1][:300]


def _cell(text) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _cpu() -> str:
    try:
        from dfmp2.benchmarks.timing import cpu_model

        return cpu_model()
    except Exception:
        return platform.processor() or "unknown"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="every step on the CPU with the smallest inputs")
    ap.add_argument("--device", default="cuda")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--steps", default=None, help="comma list of step names (default: all but grad_h2o_16)")
    which.add_argument("--preset", choices=sorted(PRESETS), default=None, help="the steps of one task (PRESETS)")
    ap.add_argument("--total-s", type=float, default=TOTAL_S, help="seconds for all steps together")
    ap.add_argument(
        "--out-dir",
        default=None,
        help="where the .json and .md go [default scripts/results/; a temporary directory for --dry-run]",
    )
    ap.add_argument("--fail-step", default=None, help=argparse.SUPPRESS)  # tests: make one step raise
    ap.add_argument("--prepare-wheels", action="store_true", help="download the wheels the GPU run carries")
    ap.add_argument(
        "--make-grad-reference",
        metavar="RESULT_JSON",
        default=None,
        help="write GRAD_REFERENCE from a `dfmp2 gradient ... --device cpu --json` document",
    )
    ap.add_argument("--step", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--spec", default=None, help=argparse.SUPPRESS)
    return ap


def run_steps(names: list[str], caps: dict, spec: dict, total_s: float, label: str) -> list[dict]:
    """Each step in its own process, in order, capped by ``caps`` and by what is left of ``total_s``
    (the clock starts here); prints one line per step."""
    t_start, recs = time.perf_counter(), []
    for name in names:
        left = total_s - (time.perf_counter() - t_start) - 5
        rec = run_step(name, spec, min(caps[name], left))
        if spec["dry"] and mol_key(name):
            rec["molecule_dry_run"] = spec["xyz"][mol_key(name)]
        recs.append(rec)
        print(f"{label}{name}: {rec['status'].upper()} in {rec.get('seconds', 0):.1f} s: {rec['reason']}", flush=True)
    return recs


def write_results(doc: dict, out_dir: Path, suffix: str, label: str) -> None:
    """The three files: gpu_acceptance_<gpu><suffix>.{json,md} and issue 59's summary,
    gpu-acceptance<suffix>.json (both named DRY_RUN_CPU in a dry run); ``suffix`` '' for the
    default run, '_<preset>' or '_<steps>'."""
    dry = doc["meta"]["dry_run_cpu"]
    gpu = "".join(c for c in str(doc["meta"]["gpu"].get("name", "gpu")).split()[-1].lower() if c.isalnum())
    stem = f"gpu_acceptance_{'DRY_RUN_CPU' if dry else gpu or 'gpu'}{suffix}"
    js, md = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    name = f"gpu-acceptance{'_DRY_RUN_CPU' if dry else ''}{'' if suffix == '_issue59' else suffix}.json"
    summ = summary(doc, source=js.name)
    js.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    md.write_text(markdown(doc))
    (out_dir / name).write_text(json.dumps(summ, indent=1) + "\n")
    met = {True: "met", False: "NOT met", None: "not known (see the summary)"}[summ["met"]]
    print(f"{label}{doc['verdict']}; issue 59: {met}; wrote {js}, {md} and {out_dir / name}", flush=True)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.step:  # inside a step's subprocess
        try:
            out = child(args.step, json.loads(args.spec))
        except Exception as e:
            out = ("fail", f"{type(e).__name__}: {_one(e)}", {})
        print(MARK + json.dumps(out, default=str), flush=True)
        return 0
    if args.prepare_wheels:
        return prepare_wheels()
    if args.make_grad_reference:
        print(f"wrote {GRAD_REFERENCE} ({make_grad_reference(args.make_grad_reference)['molecule']})")
        return 0
    only = set(PRESETS[args.preset]) if args.preset else set(args.steps.split(",")) if args.steps else set()
    if only - set(ORDER):
        sys.exit(f"error: unknown steps {', '.join(sorted(only - set(ORDER)))}; the steps are {', '.join(ORDER)}")
    dry = args.dry_run
    label = "[DRY RUN ON CPU, NOT GPU NUMBERS] " if dry else ""
    if not dry:
        import torch

        if not torch.cuda.is_available():
            sys.exit("error: no CUDA GPU visible to torch; run this on a GPU machine, or --dry-run to test it here")
    out_dir = (
        Path(args.out_dir)
        if args.out_dir
        else (Path(tempfile.mkdtemp(prefix="gpu_acceptance_dry_")) if dry else ROOT / "scripts" / "results")
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    about = meta(dry)  # imports torch: seconds on a loaded machine, before the clock --total-s bounds
    t_start = time.perf_counter()
    doc = {"meta": about, "total_s": args.total_s, "preset": args.preset, "steps": []}
    names = steps_for(only)
    caps = step_caps(names, args.total_s, "preset" if args.preset else "steps" if only else "default", dry)
    with tempfile.TemporaryDirectory() as tmp:
        spec = {
            "preset": args.preset,  # issue59's pair_peak also times bench_cuda's gemm+epilogue variants
            "dry": dry,
            "device": "cpu" if dry else args.device,
            "tmp": tmp,
            "fail_step": args.fail_step,
            "xyz": {k: str(ROOT / v) for k, v in (DRY if dry else WATERS).items()},
        }
        doc["steps"] = run_steps(names, caps, spec, args.total_s, label)
    steps = {s["name"]: s for s in doc["steps"]}
    refs = {m: {"reason": "dry run: the stored references are of the real clusters"} for m in DRY} if dry else None
    doc["checks"] = checks(steps, stored_references() if refs is None else refs)
    doc["cpu_energies"] = (
        {m: {"reason": "dry run: our stored CPU energies are of the real clusters"} for m in ISSUE59_WALL_BOUND}
        if dry
        else stored_cpu_energies()
    )
    failed = [s["name"] for s in doc["steps"] if s["status"] == "fail"] + [
        f"agreement {a['who']} vs {a['against']} {a['molecule']}"
        for a in doc["checks"]["agreement"]
        if a["passed"] is False
    ]
    doc["failed"] = failed
    doc["verdict"] = ("FAIL: " + ", ".join(failed)) if failed else "PASS (skipped steps are listed, not passed)"
    doc["wall_s"] = time.perf_counter() - t_start
    write_results(doc, out_dir, f"_{args.preset}" if args.preset else f"_{'_'.join(names)}" if only else "", label)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
