#!/usr/bin/env python
"""Benchmark: our DF-RHF (dfmp2.scf.driver, ``--scf df``) against PySCF's DF-RHF (``--scf pyscf-df``),
same molecule, basis, JK-fit set and thresholds; iteration counts beside the times. An open shell
(``--charge``/``--multiplicity`` or the XYZ comment) compares our DF-UHF (dfmp2.scf.uhf.DFUHF) with PySCF's
DF-UHF the same way (``--pyscf-max-cycle``: PySCF's limit; an unconverged PySCF is timed and marked). CPU always; CUDA when torch sees a GPU (ours on it, and gpu4pyscf's DF-RHF when it is
installed), else a 'not run' row with the reason. ``--whole`` also times the whole ``dfmp2 run``
against PySCF's DF-RHF + DF-MP2. Ours runs with --scf-precision fp64 and mixed, ``--repeat`` times
each, interleaved.

    python scripts/bench_scf.py                                  # (H2O)16 / cc-pVDZ, 2 threads
    python scripts/bench_scf.py inputs/water_clusters/h2o_32.xyz --whole --threads 16
    python scripts/bench_scf.py inputs/water_clusters/h2o_08.xyz --charge 1 --multiplicity 2   # (H2O)8+ UHF

Writes scripts/results/scf_<molecule>.json and .md (``--out`` elsewhere). Every row records the other processes' CPU use while it ran (a shared machine slows both sides).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from pyscf import lib

ROOT = Path(__file__).resolve().parent.parent

from dfmp2 import linalg
from dfmp2.benchmarks import fair_baseline as fb
from dfmp2.benchmarks.timing import OtherCPU, cpu_model
from dfmp2.df import basis
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.linalg.torch_ops import syrk_work_fraction
from dfmp2.options import RunOptions
from dfmp2.scf import driver, pyscf_scf
from dfmp2.scf import jk as scf_jk
from dfmp2.scf.settings import SCFSettings
from dfmp2.timing import Timer

GFLOPS_ASSUMED = 90.0  # the prediction's rate (a 2-core fp64 CPU's DGEMM, roughly)


def predict(nao: int, naux: int, nocc: int, block: int) -> dict:
    """Flops of one cycle of our DF-RHF: J two matrix-vector products over the packed factor,
    K one GEMM (nocc x nao x nao per P) and the SYRK (blocked triangle) per aux block."""
    npair = nao * (nao + 1) // 2
    j = 4.0 * naux * npair
    k_gemm = 2.0 * naux * nao * nao * nocc
    k_syrk = 2.0 * nao * nao * nocc * naux * syrk_work_fraction(nao, block * nocc)
    pyscf_k = 4.0 * naux * nao * nao * nocc  # PySCF: half-transform, then a full GEMM
    tot = j + k_gemm + k_syrk
    return {
        "J_gflop": j / 1e9,
        "K_gemm_gflop": k_gemm / 1e9,
        "K_syrk_gflop": k_syrk / 1e9,
        "per_cycle_gflop": tot / 1e9,
        "seconds_per_cycle_at": {f"{GFLOPS_ASSUMED:g} GFLOP/s": tot / 1e9 / GFLOPS_ASSUMED},
        "pyscf_K_gflop": pyscf_k / 1e9,
    }


def timed(fn):
    m0 = OtherCPU.mark()
    t0 = time.perf_counter()
    out = fn()
    t = time.perf_counter() - t0
    busy = OtherCPU.cores(m0, OtherCPU.mark())
    return t, out, (busy or {}).get("other_cores")


def main(argv=None):  # noqa: C901
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xyz", nargs="?", default=str(ROOT / "inputs/water_clusters/h2o_16.xyz"))
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--charge", type=int, default=None, help="molecular charge [default: the XYZ comment's]")
    ap.add_argument(
        "--multiplicity",
        type=int,
        default=None,
        help="2S+1 [default: the XYZ comment's]; an open shell runs the DF-UHF on both sides",
    )
    ap.add_argument(
        "--pyscf-max-cycle",
        type=int,
        default=300,
        help="PySCF's SCF cycle limit (its DF-UHF needs more than 200 on (H2O)8+)",
    )
    ap.add_argument("--threads", type=int, default=2, help="torch and PySCF threads")
    ap.add_argument("--whole", action="store_true", help="also the whole dfmp2 run vs PySCF DF-RHF + DF-MP2")
    fb.add_arguments(ap)
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="our SCF's fp64 and mixed runs this many times each, interleaved (order alternates)",
    )
    ap.add_argument(
        "--out",
        default=None,
        help="output path without extension (.json and .md are written) [scripts/results/scf_<xyz>]",
    )
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    lib.num_threads(args.threads)

    mol = molecule.build_molecule(read_xyz(args.xyz), args.basis, args.charge, args.multiplicity)
    uhf = mol.spin != 0
    kind, task = ("DF-UHF", "dfuhf") if uhf else ("DF-RHF", "dfrhf")
    jk = basis.default_auxbasis(mol, "jk")
    naux = basis.make_auxmol(mol, jk).nao_nr()
    nao = mol.nao_nr()
    nocc = sum(mol.nelec) if uhf else mol.nelectron // 2  # K's columns a cycle: both spins' for UHF
    pred = predict(nao, naux, nocc, scf_jk.jk_block(nao, naux, 8))
    print(
        f"{args.xyz} {kind}: nbasis {nao}, naux(JK) {naux}, nocc {nocc}; {args.threads} threads; "
        f"predicted {pred['per_cycle_gflop']:.1f} GFLOP per cycle",
        flush=True,
    )
    rows = []

    def row(who, device, t, ref, busy, **extra):
        rows.append(
            {
                "who": who,
                "device": device,
                "seconds": t,
                "iterations": ref.scf.iterations if ref else None,
                "e_hf": ref.e_hf if ref else None,
                "other_processes_cores": busy,
                **extra,
            }
        )
        print(
            f"  {who} on {device}: {t:.2f} s, {ref.scf.iterations} cycles, E(HF) {ref.e_hf:.10f}"
            + (f", {extra['fp32_cycles']} of them fp32" if extra.get("fp32_cycles") else ""),
            flush=True,
        )

    base = fb.pyscf_baseline(
        ["whole"] if args.whole else [task],
        args.xyz,
        args.basis,
        threads=args.threads,
        timeout=args.baseline_timeout,
        peak_sizes=args.peak_sizes,
        charge=args.charge,
        multiplicity=args.multiplicity,
        max_cycle=args.pyscf_max_cycle,
    )
    fb.best_or_exit(base)
    for setting, r in base["runs"].items():
        if "tasks" not in r:  # failed, or not run (a core type this CPU lacks; the same as as_set)
            rows.append(
                {
                    "who": f"pyscf {kind} ({setting})",
                    "device": "cpu",
                    "setting": setting,
                    "not_run": r.get("error") or r["not_run"],
                }
            )
            continue
        t = r["tasks"].get(task) or r["tasks"]["whole"]
        rows.append(
            {
                "who": f"pyscf {kind} ({setting})",
                "device": "cpu",
                "setting": setting,
                "seconds": t.get("scf_s", t["seconds"]),
                "iterations": t["iterations"],
                "e_hf": t["e_hf"],
                "converged": t.get("converged", True),
                "other_processes_cores": t["other_processes_cores"],
            }
        )
        print(
            f"  PySCF {kind} ({setting}): {rows[-1]['seconds']:.2f} s"
            + ("" if rows[-1]["converged"] else f", NOT converged in {t['iterations']} cycles")
            + f"; {fb.blas_summary(r['blas'])}",
            flush=True,
        )
    e_hf_p = base["tasks"].get(task, base["tasks"].get("whole"))["e_hf"]
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for dev in devices:
        be = linalg.get_backend(dev)
        for rep in range(args.repeat):  # --scf-precision fp64 and mixed, interleaved
            for prec in ("fp64", "mixed")[:: 1 if rep % 2 == 0 else -1]:
                timer = Timer(be)
                t, ref, busy = timed(
                    lambda: driver.run_scf(mol, be, SCFSettings(precision=prec, unrestricted=uhf), timer=timer)
                )
                cp = ref.scf.cycle_precision
                row(
                    f"ours (dfmp2.scf.driver {kind}, {cp['mode']})",
                    dev,
                    t,
                    ref,
                    busy,
                    stages=dict(timer.seconds),
                    kernels=ref.scf.kernels,
                    d_e_hf_vs_pyscf=None if e_hf_p is None else ref.e_hf - e_hf_p,
                    repeat=rep,
                    fp32_cycles=cp["fp32_cycles"],
                    fp64_cycles=cp["fp64_cycles"],
                    switch_gnorm=cp["switch_gnorm"],
                )
    if "cuda" not in devices:
        rows.append({"who": "ours (dfmp2.scf.driver)", "device": "cuda", "not_run": "no CUDA GPU visible to torch"})
        rows.append({"who": f"gpu4pyscf {kind}", "device": "cuda", "not_run": "no CUDA GPU visible to torch"})
    else:
        try:
            from gpu4pyscf import scf as gscf

            mf = (gscf.UHF if uhf else gscf.RHF)(mol).density_fit(auxbasis=jk)
            mf.conv_tol, mf.conv_tol_grad, mf.verbose = pyscf_scf.SCF_CONV_TOL, pyscf_scf.SCF_CONV_TOL_GRAD, 0
            t, _, busy = timed(mf.kernel)
            rows.append(
                {
                    "who": f"gpu4pyscf {kind}",
                    "device": "cuda",
                    "seconds": t,
                    "iterations": getattr(mf, "cycles", None),
                    "e_hf": float(mf.e_tot),
                    "other_processes_cores": busy,
                    "note": "first call, JIT included",
                }
            )
        except ImportError as e:
            rows.append({"who": f"gpu4pyscf {kind}", "device": "cuda", "not_run": f"gpu4pyscf not installed ({e})"})
    if args.whole:
        for setting, r in base["runs"].items():
            if "tasks" in r:
                w = r["tasks"]["whole"]
                rows.append(
                    {
                        "who": f"pyscf {kind} + DF-MP2 ({setting})",
                        "device": "cpu",
                        "seconds": w["seconds"],
                        "e_mp2": w["e_mp2"],
                        "other_processes_cores": w["other_processes_cores"],
                        "setting": setting,
                    }
                )
        for dev in devices:
            # PySCF's side checks no stability: ours neither, so both do the same work
            t, res, busy = timed(
                lambda: run(
                    args.xyz,
                    RunOptions(
                        basis=args.basis,
                        device=dev,
                        charge=args.charge,
                        multiplicity=args.multiplicity,
                        scf_stability=False,
                    ),
                )
            )
            rows.append(
                {
                    "who": "dfmp2 run (--scf df" + (", --no-scf-stability)" if uhf else ")"),
                    "device": dev,
                    "seconds": t,
                    "e_mp2": res.e_mp2,
                    "iterations": res.ran["scf"]["iterations"],
                    "timings": res.timings,
                    "other_processes_cores": busy,
                }
            )
        print(
            "  whole runs: " + ", ".join(f"{r['who']} {r['device']} {r['seconds']:.2f} s" for r in rows if "e_mp2" in r)
        )

    base_s = {}  # the fastest PySCF setting of each kind: every ratio is against it
    for key in (f"pyscf {kind} (", f"pyscf {kind} + DF-MP2"):
        mine = [r["seconds"] for r in rows if r["who"].startswith(key) and "seconds" in r]
        if mine:
            base_s[key] = min(mine)
    ours_blas = fb.blas_info()
    peaks = fb.merge_peaks(fb.gemm_peaks(args.peak_sizes), base["peaks"])
    xyz = Path(args.xyz).resolve()
    report = {
        "what": f"{kind}: ours (dfmp2.scf.driver) vs PySCF's, same process",
        "charge": mol.charge,
        "multiplicity": mol.spin + 1,
        "molecule": str(xyz.relative_to(ROOT)) if xyz.is_relative_to(ROOT) else str(xyz),
        "basis": args.basis,
        "jk_auxbasis": basis.describe_auxbasis(jk),
        "shapes": {"nbasis": nao, "naux_jk": naux, "nocc": nocc},
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpu": cpu_model(),
            "threads": args.threads,
            "platform": platform.platform(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": software_versions(),
        "prediction": pred,
        "rows": rows,
        "speedup_rule": base["rule"],
        "pyscf_baseline": base,
        "blas": {"ours": ours_blas},
        "gemm_peak": peaks,
    }
    out = Path(args.out) if args.out else ROOT / "scripts/results" / f"scf_{Path(args.xyz).stem.replace('_', '')}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    md = [
        f"# {kind}: ours vs PySCF ({report['molecule']}, charge {mol.charge}, multiplicity {mol.spin + 1}, "
        f"{args.basis}/{report['jk_auxbasis']})",
        "",
        f"{report['date']}, {report['machine']['cpu']}, {args.threads} threads, GPU {report['machine']['gpu']}, "
        f"PySCF {report['versions']['pyscf']}, torch {report['versions']['torch']}; nbasis {nao}, naux(JK) {naux}, "
        f"nocc {nocc}",
        "",
        f"Prediction per cycle: J {pred['J_gflop']:.2f} GFLOP, K {pred['K_gemm_gflop']:.1f} (GEMM) + "
        f"{pred['K_syrk_gflop']:.1f} (SYRK) GFLOP = {pred['per_cycle_gflop']:.1f} GFLOP, "
        f"{pred['per_cycle_gflop'] / GFLOPS_ASSUMED:.2f} s at {GFLOPS_ASSUMED:g} GFLOP/s "
        f"(PySCF's K: {pred['pyscf_K_gflop']:.1f} GFLOP).",
        "",
        "| run | device | s | iterations (fp32) | s / iteration | fastest PySCF / this | other processes' cores |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "not_run" in r:
            md.append(f"| {r['who']} | {r['device']} | not run: {r['not_run']} | | | | |")
            continue
        it = r.get("iterations")
        its = f"{it} ({r['fp32_cycles']})" if r.get("fp32_cycles") else f"{it or ''}"
        per = f"{r['seconds'] / it:.2f}" if it else ""
        key = f"pyscf {kind} + DF-MP2" if "e_mp2" in r else f"pyscf {kind} ("
        ratio = f"{base_s[key] / r['seconds']:.2f}" if key in base_s else ""
        if r.get("converged") is False:
            its += " (NOT converged)"
        busy = r.get("other_processes_cores")
        md.append(
            f"| {r['who']} | {r['device']} | {r['seconds']:.2f} | {its} | {per} | {ratio} | {busy:.2f} |"
            if busy is not None
            else f"| {r['who']} | {r['device']} | {r['seconds']:.2f} | {its} | {per} | {ratio} | unknown |"
        )
    md += [""] + fb.markdown_lines(base, ours_blas, peaks)
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
