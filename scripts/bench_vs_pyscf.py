#!/usr/bin/env python
"""Benchmark: the DF-MP2 stage after the SCF (integrals, metric, transforms, fit, pair
energies) against PySCF's ``mp.dfmp2.DFMP2`` on the same molecule, SCF and auxiliary basis,
in the same process. Reports median/min/max wall times and the ratio PySCF / ours.

    python scripts/bench_vs_pyscf.py                       # (H2O)16 / cc-pVDZ, fp64 and fp32
    python scripts/bench_vs_pyscf.py inputs/benzene.xyz --repeats 3
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import torch
from pyscf import lib

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks import fair_baseline as fb
from dfmp2.benchmarks.timing import OtherCPU, cpu_model, time_mp2_stage
from dfmp2.df import basis
from dfmp2.io import molecule
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.scf import pyscf_scf


def time_ours(mol, auxmol, ref, options):
    """(seconds, e_corr in Hartree, {stage: seconds}, what ran) of ``dfmp2 run``'s DF-MP2 stage."""
    t, e_os, e_ss, stages, ran = time_mp2_stage(mol, auxmol, ref, options)
    return t, e_os + e_ss, stages, ran


def _display_path(p) -> str:
    p = Path(p).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)


def stats(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xyz", nargs="?", default=str(ROOT / "inputs/water_clusters/h2o_16.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--frozen-core", action="store_true")
    fb.add_arguments(ap)
    ap.add_argument(
        "--out",
        default=str(ROOT / "scripts/results/mp2_stage_vs_pyscf"),
        help="output path without extension (.json and .md are written)",
    )
    args = ap.parse_args(argv)

    mol = molecule.build_molecule(read_xyz(args.xyz), args.basis)
    auxbasis = basis.mp2_auxbasis(mol)
    auxmol = basis.make_auxmol(mol, auxbasis)
    nfrozen = molecule.frozen_core_count(mol) if args.frozen_core else 0
    ref = pyscf_scf.run_rhf(mol, "df")
    shapes = {
        "nbasis": mol.nao_nr(),
        "nocc": ref.channels[0].nocc - nfrozen,
        "nvir": mol.nao_nr() - ref.channels[0].nocc,
        "naux": auxmol.nao_nr(),
    }
    print(
        f"{args.xyz}: {shapes}; torch threads {torch.get_num_threads()}, pyscf threads {lib.num_threads()}", flush=True
    )

    with tempfile.TemporaryDirectory() as tmp:
        base = fb.pyscf_baseline(
            ["stage"],
            args.xyz,
            args.basis,
            threads=lib.num_threads(),
            timeout=args.baseline_timeout,
            repeats=args.repeats,
            scf_npz=fb.save_scf(ref.mf, Path(tmp) / "scf.npz"),
            frozen_core=args.frozen_core,
            peak_sizes=args.peak_sizes,
        )
    fb.best_or_exit(base, "stage")
    pyscf = base["tasks"]["stage"]
    times = {"ours_fp64": [], "ours_fp32": []}
    other = {k: [] for k in times}  # other processes' CPU cores during each timed run
    energies, stage_times, ran = {"pyscf_fp64": pyscf["e_corr"]}, {}, {}
    opts = {
        p: RunOptions(basis=args.basis, device=args.device, precision=p, frozen_core=args.frozen_core)
        for p in ("fp64", "fp32")
    }
    time_ours(mol, auxmol, ref, opts["fp64"])  # warm-up (allocations, libraries)
    for rep in range(args.repeats):
        for prec in ("fp64", "fp32"):
            m0 = OtherCPU.mark()
            t, e, st, r = time_ours(mol, auxmol, ref, opts[prec])
            times[f"ours_{prec}"].append(t)
            other[f"ours_{prec}"].append(OtherCPU.cores(m0, OtherCPU.mark()))
            energies[f"ours_{prec}"], stage_times[f"ours_{prec}"], ran[f"ours_{prec}"] = e, st, r
        print(f"repeat {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)

    summary = {
        "pyscf_fp64": {
            "median": pyscf["seconds"],
            "min": pyscf["min_s"],
            "max": pyscf["max_s"],
            "n": pyscf["n"],
            "setting": base["best"],
        },
        **{k: stats(v) for k, v in times.items()},
    }
    base_s = summary["pyscf_fp64"]["median"]
    ratios = {k: base_s / summary[k]["median"] for k in ("ours_fp64", "ours_fp32")}
    ours_blas = fb.blas_info()
    peaks = fb.merge_peaks(fb.gemm_peaks(args.peak_sizes), base["peaks"])
    report = {
        "what": "DF-MP2 stage after SCF (integrals, metric, transforms, fit, pair energies)",
        "molecule": _display_path(args.xyz),
        "basis": args.basis,
        "auxbasis": basis.describe_auxbasis(auxbasis),
        "frozen_core": args.frozen_core,
        "shapes": shapes,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": torch.get_num_threads(), "platform": platform.platform()},
        "versions": software_versions(),
        "times_s": summary,
        "speedup_vs_pyscf": ratios,
        "speedup_rule": base["rule"],
        "pyscf_baseline": base,
        "blas": {"ours": ours_blas},
        "gemm_peak": peaks,
        "other_processes_cores": {
            "pyscf_fp64": [pyscf.get("other_processes_cores")],
            **{k: [c and c["other_cores"] for c in v] for k, v in other.items()},
        },
        "stage_times_s": stage_times,
        "ran": ran,
        "e_corr": energies,
        "e_corr_diff_vs_pyscf": {k: energies[k] - energies["pyscf_fp64"] for k in ("ours_fp64", "ours_fp32")},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# DF-MP2 stage after SCF vs PySCF ({report['molecule']}, {args.basis}/{report['auxbasis']})",
        "",
        f"{report['date']}, {report['machine']['cpu']}, {report['machine']['cores']} threads, "
        f"PySCF {report['versions']['pyscf']}, torch {report['versions']['torch']}; shapes {shapes}",
        "",
        "| run | device / engine | median s | min s | max s | PySCF / this | ΔE_corr vs PySCF / Eh "
        "| other processes' CPU cores (max) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, s in summary.items():
        eng = (
            f"cpu / PySCF (C, fp64; {base['best']})"
            if k.startswith("pyscf")
            else f"{ran[k]['device']} / {ran[k]['engine']}"
        )
        ratio = "1.00" if k.startswith("pyscf") else f"{ratios[k]:.2f}"
        d = "—" if k.startswith("pyscf") else f"{report['e_corr_diff_vs_pyscf'][k]:.1e}"
        busy = [c for c in report["other_processes_cores"][k] if c is not None]
        md.append(
            f"| {k} | {eng} | {s['median']:.2f} | {s['min']:.2f} | {s['max']:.2f} | {ratio} | {d} | "
            + (f"{max(busy):.2f}" if busy else "unknown")
            + " |"
        )
    md += [
        "",
        "Stage times of the last repeat (s): "
        + "; ".join(f"{k}: " + ", ".join(f"{s} {v:.2f}" for s, v in st.items()) for k, st in stage_times.items()),
        "",
    ]
    md += fb.markdown_lines(base, ours_blas, peaks)
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
