#!/usr/bin/env python
"""Benchmark: the whole ``dfmp2 run`` against the machine's roofline, in one process. First the
best DGEMM (and SGEMM) of any library here (torch and numpy, square sizes ``--peak-sizes``, best of
3 calls: dfmp2.benchmarks.fair_baseline.gemm_peaks); then the run (dfmp2.interfaces.api.run,
``--warmup`` untimed, ``--repeats`` timed), each stage's median seconds beside the flops it
executed through dfmp2.linalg (the result's ``flops``), its GF/s and share of that DGEMM peak, the
algorithm's useful work (dfmp2.benchmarks.roofline) and the whole run's share: flops / (wall x
best DGEMM). Then (unless ``--no-pyscf``) PySCF's DF-RHF + DF-MP2 on the same molecule in each BLAS
setting (fair_baseline.SETTINGS: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE as set, unset, and
OPENBLAS_CORETYPE=Haswell and =SkylakeX where the CPU runs them, each in its own process), the
ratio against the fastest and |ΔE(MP2)|.

    python scripts/bench_roofline.py                                   # (H2O)16 / cc-pVDZ, 2 threads
    python scripts/bench_roofline.py inputs/water_clusters/h2o_04.xyz --repeats 1 --cpu-blas openblas
    python scripts/bench_roofline.py --fresh                           # each run in a new process

``--fresh``: every run (warm-ups included) in a new process, as ``dfmp2 run`` runs: the process
measures its best DGEMM first, then runs once, and its share of the roofline uses that peak (the
stage table uses the median of the timed runs' peaks). Runs after the first in one process touch
memory the first one freed, and on a VM whose fresh pages cost a second or more per GB that makes
them differ from what a user's run sees (scripts/results/roofline_h2o16.md).

Writes scripts/results/roofline_<molecule>.json and .md (``--out`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from pyscf import lib

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks import fair_baseline as fb
from dfmp2.benchmarks import roofline
from dfmp2.benchmarks.timing import OtherCPU, cpu_model, now
from dfmp2.interfaces.api import run
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.options import CPU_BLAS_CHOICES, PRECISIONS, SCF_PRECISIONS, RunOptions


def _display_path(p) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


CHILD = "@@roofline-run@@"  # the marker of a --fresh child's result line


def fresh_run(args) -> tuple[dict, dict]:
    """One run in a new process (``--fresh``): (its result's JSON, its own best GEMMs)."""
    spec = {k: getattr(args, k) for k in ("xyz", "basis", "threads", "cpu_blas", "precision", "scf_precision")}
    spec |= {"frozen_core": args.frozen_core, "peak_sizes": args.peak_sizes}
    p = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)], capture_output=True, text=True
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith(CHILD)]
    if p.returncode != 0 or not lines:
        sys.exit(f"error: a --fresh run exited {p.returncode}: {(p.stderr or p.stdout).strip()[-300:]}")
    got = json.loads(lines[-1][len(CHILD) :])
    return got["doc"], got["peaks"]


def run_options(a: dict) -> RunOptions:
    """The run's options from the arguments (``vars(args)``, or a --fresh child's spec)."""
    return RunOptions(
        basis=a["basis"],
        cpu_blas=a["cpu_blas"],
        precision=a["precision"],
        frozen_core=a["frozen_core"],
        scf_precision=a["scf_precision"],
    )


def child(spec: dict) -> None:
    """A --fresh run's process: its best GEMMs, then one run; prints both on one marked line."""
    torch.set_num_threads(spec["threads"])
    lib.num_threads(spec["threads"])
    peaks = fb.gemm_peaks(spec["peak_sizes"])
    doc = run(read_xyz(spec["xyz"]), run_options(spec)).to_dict()
    print(CHILD + json.dumps({"doc": doc, "peaks": peaks}), flush=True)


def run_ours(geom, options, warmup: int, repeats: int, fresh=None) -> tuple[list[dict], dict]:
    """``warmup`` untimed runs, then ``repeats`` timed ones: ([{wall_s, timings, flops, e_mp2,
    other_processes_cores, dgemm_peak (``fresh``: its process's GF/s)}], the last result's JSON).
    ``fresh``: the parsed arguments, each run in a new process (``fresh_run``)."""
    for _ in range(warmup):
        fresh_run(fresh) if fresh is not None else run(geom, options)
    runs = []
    for rep in range(repeats):
        m0 = OtherCPU.mark()
        if fresh is not None:
            doc, peaks = fresh_run(fresh)
        else:
            doc, peaks = json.loads(json.dumps(run(geom, options).to_dict())), None
        busy = OtherCPU.cores(m0, OtherCPU.mark())
        runs.append(
            {
                "wall_s": doc["wall_s"],
                "timings": doc["timings"],
                "flops": doc["flops"],
                "e_mp2": doc["energies"]["e_mp2"],
                "scf_iterations": (doc["ran"].get("scf") or {}).get("iterations"),
                "other_processes_cores": busy and busy["other_cores"],
                "dgemm_peak": peaks and peaks["fp64"]["gflops"],
            }
        )
        print(f"repeat {rep + 1}: {doc['wall_s']:.2f} s, {sum(doc['flops'].values()) / 1e9:.2f} GFLOP", flush=True)
    return runs, doc


def median_stages(runs: list[dict]) -> dict:
    """{stage: median seconds over the runs} (a stage missing from a run counts 0 there)."""
    stages = dict.fromkeys(k for r in runs for k in r["timings"])
    return {s: statistics.median(r["timings"].get(s, 0.0) for r in runs) for s in stages}


def pyscf_side(args, e_mp2: float, wall_s: float) -> dict:
    """PySCF's DF-SCF + DF-MP2 in each BLAS setting (fair_baseline), the ratio against the fastest
    and |ΔE(MP2)| of ours; {'skipped': why} with --no-pyscf."""
    if args.no_pyscf:
        return {"skipped": "--no-pyscf"}
    base = fb.pyscf_baseline(
        ["whole"],
        args.xyz,
        args.basis,
        threads=args.threads,
        timeout=args.baseline_timeout,
        frozen_core=args.frozen_core,
        peak_sizes=args.peak_sizes,
    )
    fb.best_or_exit(base, "whole")
    w = base["tasks"]["whole"]
    return {
        "baseline": base,
        "seconds": w["seconds"],
        "scf_s": w["scf_s"],
        "mp2_s": w["mp2_s"],
        "e_mp2": w["e_mp2"],
        "setting": base["best"],
        "pyscf_over_ours": w["seconds"] / wall_s,
        "abs_delta_e_mp2": abs(e_mp2 - w["e_mp2"]),
    }


def markdown(report: dict) -> list[str]:
    """The report as markdown lines: the header, the stage table, PySCF's rows, the fairness notes."""
    m, peak, whole = report["machine"], report["gemm_peak"], report["whole"]
    o = report["options"]
    md = [
        f"# The whole dfmp2 run against the roofline ({report['molecule']}, {report['basis']})",
        "",
        f"{report['date']}, {m['cpu']}, {m['threads']} threads, {m['platform']}; dfmp2 "
        f"{report['versions']['dfmp2']}, PySCF {report['versions']['pyscf']}, torch {report['versions']['torch']}, "
        f"numpy {report['versions']['numpy']}",
        "",
        f"Options: --cpu-blas {o['cpu_blas']}, --precision {o['precision'] or 'default'}, "
        f"--scf-precision {o.get('scf_precision', 'auto')}"
        f"{', --frozen-core' if o['frozen_core'] else ''}; {o['warmup']} warm-up run(s), {o['repeats']} timed"
        f"{' (each in a new process)' if o.get('fresh') else ''} "
        f"(stage seconds and wall: medians); shapes {report['shapes']}; SCF iterations {report['scf_iterations']}.",
        "",
        (
            f"Each run in a new process (--fresh), which measured its own best DGEMM first: "
            f"{', '.join(format(r['dgemm_peak'], '.1f') for r in report['runs'])} GFLOP/s; the stage table uses their "
            f"median, **{whole['peak_gflops']:.1f} GFLOP/s**, the whole run's share is the median of each run's "
            f"against its own ({', '.join(format(x, '.1f') + ' %' for x in whole['pct_each_run'])}). "
            if o.get("fresh")
            else f"Roofline: the best DGEMM measured in this process, **{peak['fp64']['gflops']:.1f} GFLOP/s** "
            f"({peak['fp64']['library']}, n = {peak['fp64']['n']}); SGEMM {peak['fp32']['gflops']:.1f} GFLOP/s "
            f"({peak['fp32']['library']}). "
        )
        + "Flops: executed through dfmp2.linalg (docs/cli-and-json.md); "
        "model: the algorithm's useful work (dfmp2/benchmarks/roofline.py).",
        "",
        *roofline.markdown_table(report["stages"], whole),
        "",
        f"Whole run: {whole['flops'] / 1e9:.4g} GFLOP in {whole['wall_s']:.2f} s (min "
        f"{report['wall_s']['min']:.2f}, max {report['wall_s']['max']:.2f}) = {whole['gflops_per_s']:.3g} GFLOP/s, "
        f"**{whole['pct_of_dgemm_peak']:.1f} % of the DGEMM roofline**.",
    ]
    busy = [r["other_processes_cores"] for r in report["runs"] if r["other_processes_cores"] is not None]
    md.append(f"Other processes' CPU cores during the timed runs (max): {max(busy):.2f}." if busy else "")
    if o["precision"] == "fp32":
        md.append("(fp32: the pair step runs SGEMMs, so its share of the DGEMM peak may exceed 100 %.)")
    p = report["pyscf"]
    if "skipped" in p:
        return md + ["", f"PySCF baseline not run ({p['skipped']})."]
    md += [
        "",
        "| run | s | SCF s | MP2 s | fastest PySCF / this | E(MP2) / Eh | abs ΔE(MP2) vs PySCF / Eh |",
        "|---|---|---|---|---|---|---|",
        f"| PySCF DF-SCF + DF-MP2 ({p['setting']}) | {p['seconds']:.2f} | {p['scf_s']:.2f} | {p['mp2_s']:.2f} | "
        f"1.00 | {p['e_mp2']:.10f} | — |",
        f"| dfmp2 run (wall) | {whole['wall_s']:.2f} | | | {p['pyscf_over_ours']:.2f} | {report['e_mp2']:.10f} | "
        f"{p['abs_delta_e_mp2']:.1e} |",
        "",
    ]
    return md + fb.markdown_lines(p["baseline"], report["blas"]["ours"], peak)


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xyz", nargs="?", default=str(ROOT / "inputs/water_clusters/h2o_16.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--threads", type=int, default=2, help="torch and PySCF threads")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs of ours")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of ours first")
    ap.add_argument("--cpu-blas", default="auto", choices=CPU_BLAS_CHOICES, help="as dfmp2 run's --cpu-blas")
    ap.add_argument("--precision", default=None, choices=PRECISIONS, help="as dfmp2 run's --precision")
    ap.add_argument("--scf-precision", default="auto", choices=SCF_PRECISIONS, help="as dfmp2 run's --scf-precision")
    ap.add_argument("--frozen-core", action="store_true")
    ap.add_argument("--no-pyscf", action="store_true", help="skip PySCF's baseline")
    ap.add_argument("--fresh", action="store_true", help="every run in a new process, with its own DGEMM peak")
    fb.add_arguments(ap)
    ap.add_argument("--out", default=None, help="output path without extension [scripts/results/roofline_<xyz>]")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        ap.error("--repeats must be at least 1 and --warmup at least 0")
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        return child(json.loads(argv[1]))
    args = parse(argv)
    torch.set_num_threads(args.threads)
    lib.num_threads(args.threads)
    geom = read_xyz(args.xyz)
    options = run_options(vars(args))
    t0 = time.perf_counter()
    peaks = fb.gemm_peaks(args.peak_sizes)  # this process's: the roofline (--fresh: each run's own)
    print(
        f"DGEMM peak {peaks['fp64']['gflops']:.1f} GFLOP/s ({peaks['fp64']['library']}, n = {peaks['fp64']['n']}), "
        f"{time.perf_counter() - t0:.1f} s to measure",
        flush=True,
    )
    runs, doc = run_ours(geom, options, args.warmup, args.repeats, fresh=args if args.fresh else None)
    wall = [r["wall_s"] for r in runs]
    seconds, flops = median_stages(runs), runs[-1]["flops"]
    peak = statistics.median(r["dgemm_peak"] for r in runs) if args.fresh else peaks["fp64"]["gflops"]
    whole = roofline.whole_run(statistics.median(wall), flops, peak)
    if args.fresh:  # each run against its own process's peak
        shares = [roofline.whole_run(r["wall_s"], r["flops"], r["dgemm_peak"])["pct_of_dgemm_peak"] for r in runs]
        whole["pct_each_run"], whole["peak_gflops"] = shares, peak
        whole["pct_of_dgemm_peak"] = statistics.median(shares)
    report = {
        "what": "the whole dfmp2 run: flops per stage against the best DGEMM of this process",
        "molecule": _display_path(args.xyz),
        "basis": args.basis,
        "auxbasis": doc["auxbasis"],
        "jk_auxbasis": doc["jk_auxbasis"],
        "shapes": doc["shapes"],
        "scf_iterations": runs[-1]["scf_iterations"],
        "date": now(),
        "machine": {"cpu": cpu_model(), "threads": args.threads, "platform": platform.platform()},
        "versions": software_versions(),
        "options": {
            k: getattr(args, k)
            for k in ("cpu_blas", "precision", "scf_precision", "frozen_core", "repeats", "warmup", "fresh")
        },
        "blas": {"ours": fb.blas_info()},
        "gemm_peak": peaks,
        "stages": roofline.stage_rows(seconds, flops, roofline.useful_flops(doc), peak),
        "whole": whole,
        "wall_s": {"median": whole["wall_s"], "min": min(wall), "max": max(wall), "n": len(wall)},
        "flops_same_every_repeat": all(r["flops"] == flops for r in runs),
        "runs": runs,
        "e_mp2": runs[-1]["e_mp2"],
        "ran": doc["ran"],
    }
    report["pyscf"] = pyscf_side(args, report["e_mp2"], whole["wall_s"])
    out = Path(args.out) if args.out else ROOT / "scripts/results" / f"roofline_{Path(args.xyz).stem.replace('_', '')}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = markdown(report)
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
