"""CUDA benchmark of the MP2 pair step against the same GPU's measured DGEMM rate, in one command.

    python scripts/bench_cuda.py                       # (H2O)32/cc-pVDZ-sized synthetic pair step:
                                                       # nocc 160, nvir 608, naux 2688; fp64 + fp32;
                                                       # tile sweep; a few minutes on an H100
    python scripts/bench_cuda.py --quick               # smaller shape, no sweep (~1 min)
    python scripts/bench_cuda.py --molecule inputs/water_clusters/h2o_08.xyz   # + the whole pipeline
                                                       # on CUDA (CudaBackend) and on CPU, ΔE_corr

Writes scripts/results/cuda_pair_<gpu>.json and .md: date, GPU (name, compute capability, SMs,
memory, driver), versions (torch, its CUDA, Triton, Python), the dfmp2 commit, the command line,
the DGEMM and SGEMM (TF32 off) peaks measured at the start of the same run (largest of a few square
sizes), and for each pair-step path and precision: median/min/max seconds over repeats after a
warm-up, GFLOP/s from the nominal flop count nocc(nocc+1)/2 * 2 nvir^2 naux, % of the same-precision
GEMM peak, the energies (with float.hex), |Δ| against torch's unfused path, whether repeated runs
were bit-identical, the kernel label that CudaBackend recorded, and how Triton lowered the fp64
dot (tensor-core mma.f64 or FMA) read from the PTX. The 80 % DGEMM target is checked for fp64.

Paths: fused (kernels/triton/fused_pair_energy.py, default tiles and the best of a sweep),
gemm+epilogue (cuBLAS K blocks + kernels/triton/pair_energy_epilogue.py) and torch (the unfused
linalg.torch_ops path, cuBLAS batched GEMM + torch elementwise ops) for reference.

--dry-run-cpu runs the script's logic on this CPU through Triton's interpreter at a tiny shape and
writes to /tmp unless --out is given; every output line then says CPU INTERPRETER, NOT A GPU.

The script runs to the end whatever one measurement does: a path, a configuration, the PTX probe,
a GEMM peak or the pipeline that fails (a kernel that does not compile, a launch error, no memory)
becomes an error entry in the JSON and markdown (``failures`` lists them all), and the other
paths are still measured. Exit status 1 when a default path, a probe or the pipeline failed (a
swept configuration that does not fit the GPU is expected to fail and does not count), else 0.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SHAPE_FULL = (160, 608, 2688)  # (H2O)32 / cc-pVDZ, cc-pVDZ-RI, all-electron: nocc, nvir, naux
SHAPE_QUICK = (64, 400, 1500)
SHAPE_DRY = (3, 40, 48)
TARGET_PCT_DGEMM = 80.0  # issue 59: the pair step at 80 % of the DGEMM peak or more
# gemm+epilogue variants measured with --variants or the sweep, beside the default: larger
# row chunks of K (max_elems: 2 and 4 GiB in fp64, against 512 MiB) and the pipeline's blocking
# (occ_block: the memory plan's OCC_BLOCK_MAX, one call per block pair as dfmp2 run makes them);
# what they measure decides the GPU's defaults
GEMM_EPILOGUE_VARIANTS = [{"max_elems": 1 << 28}, {"max_elems": 1 << 29}, {"occ_block": 16}]
SWEEP = {  # fused-kernel configurations tried on the benchmark shape (the default first; configurations
    # that exceed the GPU's shared memory or registers are reported as failed)
    "fp64": [
        dict(BLOCK=b, BLOCK_P=p, num_warps=w, num_stages=s)
        for b, p, w, s in [
            (64, 16, 8, 3),
            (64, 16, 4, 3),
            (64, 16, 8, 4),
            (64, 32, 4, 2),
            (64, 32, 8, 3),
            (32, 32, 4, 3),
            (32, 16, 4, 4),
            (128, 16, 8, 2),
        ]
    ],
    "fp32": [
        dict(BLOCK=b, BLOCK_P=p, num_warps=w, num_stages=s)
        for b, p, w, s in [
            (64, 32, 8, 3),
            (64, 32, 4, 3),
            (64, 64, 8, 3),
            (128, 32, 8, 3),
            (128, 16, 8, 4),
            (128, 64, 8, 2),
            (32, 32, 4, 4),
            (64, 16, 4, 4),
        ]
    ],
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--shape",
        default=None,
        metavar="NOCC,NVIR,NAUX",
        help=f"synthetic pair-step shape [default {','.join(map(str, SHAPE_FULL))}]",
    )
    ap.add_argument("--quick", action="store_true", help=f"shape {SHAPE_QUICK}, no tile sweep")
    ap.add_argument("--precisions", default="fp64,fp32")
    ap.add_argument("--no-sweep", action="store_true", help="only the default fused configuration")
    ap.add_argument(
        "--variants",
        action="store_true",
        help="also gemm+epilogue's GEMM_EPILOGUE_VARIANTS (larger row chunks, the pipeline's blocking) without "
        "the sweep (a sweep runs them anyway)",
    )
    ap.add_argument(
        "--occ-block",
        type=int,
        default=0,
        help="call the pair step per occupied block pair as the pipeline does (0: one call)",
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--molecule", default=None, help="also run the whole pipeline on this XYZ (cuda and cpu)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None, help="output prefix [default scripts/results/cuda_pair_<gpu>]")
    ap.add_argument(
        "--dry-run-cpu",
        action="store_true",
        help="exercise the script on the CPU via Triton's interpreter (tiny shape, NOT a GPU number)",
    )
    return ap.parse_args(argv)


# --------------------------------------------------------------------------------------------------
def timed(fn, sync, repeats: int, warmup: int = 1):
    """(stats, last result): median/min/max seconds of ``repeats`` calls after ``warmup``, synchronised."""
    out = None
    for _ in range(warmup):
        out = fn()
    sync()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = fn()
        sync()
        times.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": repeats}, out


def gemm_peak(torch, dtype, device, sizes, sync, repeats):
    """Largest torch.matmul rate (TFLOP/s, median timing) over square sizes; TF32 is off for fp32."""
    best = None
    rows = []
    for n in sizes:
        a = torch.randn(n, n, dtype=dtype, device=device)
        b = torch.randn(n, n, dtype=dtype, device=device)
        st, _ = timed(lambda a=a, b=b: torch.matmul(a, b), sync, repeats, warmup=2)
        tf = 2.0 * n**3 / st["median_s"] / 1e12
        rows.append({"n": n, **st, "tflops": tf})
        if best is None or tf > best["tflops"]:
            best = rows[-1]
        del a, b
    return {"tflops": best["tflops"], "n": best["n"], "sizes": rows}


def fp64_dot_lowering(torch, B, eo, ev, config, interpret: bool) -> str:
    """How Triton lowered the fused kernel's fp64 dot, read from the compiled PTX."""
    if interpret:
        return "interpreter (numpy matmul)"
    from dfmp2.kernels.triton import fused_pair_energy as fpe
    from dfmp2.kernels.triton.launch import pair_lists, tile_pairs

    cfg = {**fpe.default_config(B.dtype), **(config or {})}
    dev = B.device
    Bs = B[:2]
    pi, pj, _ = pair_lists(2, 2, True, dev)
    ta, tb = tile_pairs(B.shape[1], cfg["BLOCK"], False, dev)
    if ta.numel() == 0:
        ta, tb = tile_pairs(B.shape[1], cfg["BLOCK"], True, dev)
    buf = torch.empty((pi.numel(), ta.numel()), dtype=torch.float64, device=dev)
    ck = fpe.kernel()[(ta.numel(), pi.numel())](
        Bs,
        Bs,
        *Bs.stride(),
        *Bs.stride(),
        pi,
        pj,
        ta,
        tb,
        eo,
        eo,
        ev,
        buf,
        torch.empty_like(buf),
        B.shape[1],
        B.shape[2],
        ta.numel(),
        DIAG=False,
        FP32=False,
        BLOCK=cfg["BLOCK"],
        BLOCK_P=cfg["BLOCK_P"],
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    ptx = getattr(ck, "asm", {}).get("ptx", "")
    if not ptx:
        return "unknown (no PTX available)"
    if "mma.sync.aligned" in ptx and ".f64.f64.f64.f64" in ptx:
        shapes = sorted(
            {
                ln.split("mma.sync.aligned.")[1].split(".")[0]
                for ln in ptx.splitlines()
                if "mma.sync.aligned." in ln and "f64" in ln
            }
        )
        return f"tensor cores: mma.sync f64 ({', '.join(shapes)})"
    if "fma.rn.f64" in ptx:
        return "CUDA cores: fma.rn.f64 (no f64 mma in the PTX)"
    return "unknown (neither f64 mma nor f64 fma found in the PTX)"


def pair_step(torch, linalg, be, B, eo, ev, occ_block: int):
    """(e_os, e_ss) over all pairs: one symmetric call, or the pipeline's occupied-block loop."""
    if not occ_block:
        return be.mp2_pair_energy(B, B, eo, eo, ev, symmetric=True)
    nocc = B.shape[0]
    e_os = e_ss = 0.0
    for I in range(0, nocc, occ_block):
        for J in range(0, I + 1, occ_block):
            o, s = be.mp2_pair_energy(
                B[I : I + occ_block],
                B[J : J + occ_block],
                eo[I : I + occ_block],
                eo[J : J + occ_block],
                ev,
                symmetric=(I == J),
            )
            w = 1.0 if I == J else 2.0
            e_os, e_ss = e_os + w * o, e_ss + w * s
    return e_os, e_ss


# --------------------------------------------------------------------------------------------------
def gpu_meta(torch, device, dry: bool) -> dict:
    if dry:
        return {"name": "CPU INTERPRETER, NOT A GPU", "cpu": platform.processor() or platform.machine()}
    p = torch.cuda.get_device_properties(device)
    meta = {
        "name": p.name,
        "compute_capability": f"{p.major}.{p.minor}",
        "sms": p.multi_processor_count,
        "memory_gib": round(p.total_memory / 2**30, 1),
    }
    try:
        q = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=driver_version,clocks.max.sm,power.limit",
                "--format=csv,noheader",
                "-i",
                str(torch.device(device).index or 0),
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if q.returncode == 0:
            drv, clk, pwr = (x.strip() for x in q.stdout.strip().split(","))
            meta.update(driver=drv, max_sm_clock=clk, power_limit=pwr)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return meta


def versions(torch) -> dict:
    import triton

    v = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "triton": triton.__version__,
        "python": platform.python_version(),
    }
    try:
        v["dfmp2_commit"] = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "kernels", "linalg"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if dirty:
            v["dfmp2_commit"] += " (+ uncommitted changes in kernels/ or linalg/)"
    except (OSError, subprocess.SubprocessError):
        pass
    return v


def slug(name: str) -> str:
    return "".join(c.lower() if c.isalnum() else "_" for c in name).strip("_")[:40] or "gpu"


# --------------------------------------------------------------------------------------------------
def main(argv=None):  # noqa: C901
    args = parse_args(argv)
    if args.dry_run_cpu:
        os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (script, not library)
    elif os.environ.get("TRITON_INTERPRET", "0") == "1":
        sys.exit(
            "error: TRITON_INTERPRET=1 is set: that runs the kernels on the CPU; unset it for a "
            "GPU benchmark (or use --dry-run-cpu)"
        )
    import torch

    from dfmp2 import linalg
    from dfmp2.linalg.cuda import CudaBackend, auto_pair_path, one_line
    from dfmp2.linalg.synthetic import synthetic_problem

    dry = args.dry_run_cpu
    if not dry and not torch.cuda.is_available():
        sys.exit(
            f"error: no CUDA GPU is usable here (torch {torch.__version__}, "
            f"torch.version.cuda={torch.version.cuda}); run this on a GPU machine, "
            "or --dry-run-cpu to exercise the script"
        )
    device = "cpu" if dry else args.device
    sync = (lambda: None) if dry else (lambda: torch.cuda.synchronize(device))
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 everywhere here
    torch.backends.cudnn.allow_tf32 = False

    if args.shape:
        shape = tuple(int(x) for x in args.shape.split(","))
    else:
        shape = SHAPE_DRY if dry else (SHAPE_QUICK if args.quick else SHAPE_FULL)
    nocc, nvir, naux = shape
    sweep = not (args.no_sweep or args.quick or dry)
    repeats = 2 if dry else args.repeats
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    flops = nocc * (nocc + 1) / 2 * 2.0 * nvir * nvir * naux

    label = "CPU INTERPRETER, NOT A GPU" if dry else None
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "gpu": gpu_meta(torch, device, dry),
        "versions": versions(torch),
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "shape": {
            "nocc": nocc,
            "nvir": nvir,
            "naux": naux,
            "note": "(H2O)32/cc-pVDZ all-electron sizes" if shape == SHAPE_FULL else "custom",
        },
        "pair_flops": flops,
        "flop_count": "nocc(nocc+1)/2 * 2 nvir^2 naux (i >= j pairs)",
        "occ_block": args.occ_block or "one call over all pairs",
        "repeats": repeats,
        "dry_run_cpu": dry,
    }
    say = (lambda m: print(f"[{label}] {m}", flush=True)) if dry else (lambda m: print(m, flush=True))
    say(
        f"{meta['gpu']['name']}: torch {torch.__version__} (CUDA {torch.version.cuda}), "
        f"triton {meta['versions']['triton']}; pair shape nocc={nocc} nvir={nvir} naux={naux}, "
        f"{flops / 1e12:.2f} TFLOP per pair step"
    )

    # 1. GEMM peaks, same run.
    sizes = [256, 512] if dry else [4096, 8192, 12288]
    peaks, failures = {}, []

    def failed(what: str, exc: Exception, counts: bool = True) -> str:
        """Record a failed measurement (one line); ``counts``: it makes the exit status 1."""
        msg = one_line(exc)
        failures.append({"what": what, "error": msg, "counts": counts})
        return msg

    for prec, dt in (("fp64", torch.float64), ("fp32", torch.float32)):
        if prec in precisions:
            name = "DGEMM" if prec == "fp64" else "SGEMM (TF32 off)"
            try:
                peaks[prec] = gemm_peak(torch, dt, device, sizes, sync, 2 if dry else 5)
                say(f"{name} peak: {peaks[prec]['tflops']:.2f} TFLOP/s (n={peaks[prec]['n']})")
            except Exception as exc:
                peaks[prec] = {"tflops": None, "n": None, "error": failed(f"{prec} GEMM peak", exc)}
                say(f"{name} peak FAILED: {peaks[prec]['error']}")

    # 2. The synthetic problem, generated on the host and copied (bit-identical to the CPU's).
    t0 = time.perf_counter()
    prob = synthetic_problem(nocc, nvir, naux, seed=2024, device=device)
    Bt = prob.B.permute(2, 0, 1).reshape(naux, nocc * nvir).contiguous()  # the pipeline's layout
    del prob.B
    B64 = Bt.view(naux, nocc, nvir).permute(1, 2, 0)
    eo, ev = prob.eps_occ, prob.eps_vir
    sync()
    say(f"synthetic problem in {time.perf_counter() - t0:.1f} s (B in the pipeline's Bt layout)")

    rows, sweep_rows = [], []
    for prec in precisions:
        B = B64 if prec == "fp64" else B64.to(torch.float32)  # .to() keeps the Bt-view strides
        peak = peaks[prec]["tflops"]  # None if the peak failed: no % of peak then
        ref = None
        candidates = [("torch", None), ("gemm+epilogue", None), ("fused", None)]
        if args.variants or sweep:
            candidates += [("gemm+epilogue", v) for v in GEMM_EPILOGUE_VARIANTS]
        if sweep:
            candidates += [("fused", c) for c in SWEEP[prec][1:]]
        for path, config in candidates:
            be = None
            try:  # a path or config that fails is reported, not hidden
                blocks = (config or {}).get("occ_block", args.occ_block)
                kernel_config = {k: v for k, v in (config or {}).items() if k != "occ_block"} or None
                be = (
                    linalg.TorchBackend(device)
                    if path == "torch"
                    else CudaBackend(args.device, pair_path={prec: path}, pair_config=kernel_config)
                )
                st, (e_os, e_ss) = timed(lambda: pair_step(torch, linalg, be, B, eo, ev, blocks), sync, repeats)
                again = pair_step(torch, linalg, be, B, eo, ev, blocks)
                error = None
            except Exception as exc:
                st, e_os, e_ss, again = None, float("nan"), float("nan"), None
                error = failed(
                    f"{prec} {path} {json.dumps(config) if config else 'default'}", exc, counts=config is None
                )
            row = {
                "precision": prec,
                "path": path,
                "config": config or ("default" if path == "fused" else None),
                "kernels": sorted(be.kernels_used) if be is not None else [],
                "error": error,
            }
            if st is not None:
                gf = flops / st["median_s"] / 1e9
                row.update(
                    st,
                    gflops=gf,
                    pct_of_gemm_peak=100.0 * gf / (peak * 1e3) if peak else None,
                    e_os=e_os,
                    e_ss=e_ss,
                    hex=[float.hex(e_os), float.hex(e_ss)],
                    run_to_run_identical=(float.hex(again[0]), float.hex(again[1]))
                    == (float.hex(e_os), float.hex(e_ss)),
                )
                if path == "torch":
                    ref = (e_os, e_ss)
                if ref is not None:
                    row["abs_diff_vs_torch"] = abs((e_os + e_ss) - sum(ref))
            (rows if config is None or path == "gemm+epilogue" else sweep_rows).append(row)
            if config is not None and sweep:
                row["sweep"] = True
            say(
                f"{prec} {path:14s} {json.dumps(config) if config else '':60s} "
                + (
                    f"{st['median_s']:.4f} s  {row['gflops']:9.1f} GFLOP/s  {row['pct_of_gemm_peak'] or 0:5.1f}% of "
                    f"{'DGEMM' if prec == 'fp64' else 'SGEMM'}  Δ={row.get('abs_diff_vs_torch', 0):.1e}  "
                    f"bits {'stable' if row['run_to_run_identical'] else 'DIFFER'}"
                    if st is not None
                    else f"FAILED: {error}"
                )
            )
        fused_all = [
            r for r in rows + sweep_rows if r["precision"] == prec and r["path"] == "fused" and r.get("gflops")
        ]
        if fused_all:
            best = max(fused_all, key=lambda r: r["gflops"])
            best_row = dict(best, path="fused (best of sweep)" if sweep else "fused")
            if sweep:
                rows.append(best_row)
        if prec == "fp64":
            try:
                meta["fp64_dot_lowering"] = fp64_dot_lowering(torch, B, eo, ev, None, dry)
            except Exception as exc:
                meta["fp64_dot_lowering"] = f"probe failed: {failed('fp64 dot lowering probe (fused kernel PTX)', exc)}"
            say(f"fp64 dot lowering: {meta['fp64_dot_lowering']}")

    # 3. Verdicts, and the path that CudaBackend's auto rule takes on this GPU today: where the two
    # differ, this run's numbers belong in linalg.cuda.PAIR_PATH_MEASUREMENTS.
    capability = None if dry else tuple(torch.cuda.get_device_capability(device))
    verdict = {}
    for prec in precisions:
        ok = [r for r in rows if r["precision"] == prec and r.get("gflops")]
        if not ok or not peaks[prec]["tflops"]:
            continue
        ours = [r for r in ok if r["path"] != "torch"]  # the paths CudaBackend can take
        fastest = max(ours or ok, key=lambda r: r["gflops"])
        torch_row = next((r for r in ok if r["path"] == "torch"), None)
        fused_default = next((r for r in ok if r["path"] == "fused" and r["config"] == "default"), None)
        verdict[prec] = {
            "fastest_path": fastest["path"],
            "fastest_config": fastest["config"],
            "fastest_pct_of_gemm_peak": fastest["pct_of_gemm_peak"],
            "fused_default_pct_of_gemm_peak": fused_default and fused_default["pct_of_gemm_peak"],
            "torch_unfused_pct_of_gemm_peak": torch_row and torch_row["pct_of_gemm_peak"],
            "recommended_pair_path": fastest["path"].split(" ")[0],
            "auto_pair_path": auto_pair_path(prec, capability)[0],
        }
        if prec == "fp64":
            verdict[prec]["target_pct_dgemm"] = TARGET_PCT_DGEMM
            verdict[prec]["target_met_by"] = [
                f"{r['path']} {r['config']}"
                for r in ok
                if r["path"] != "torch" and r["pct_of_gemm_peak"] >= TARGET_PCT_DGEMM
            ]
    meta["verdict"] = verdict

    # 4. Optional whole pipeline.
    pipeline = None
    if args.molecule and not dry:
        pipeline = run_pipeline(args.molecule, device, say, failed)

    out = (
        Path(args.out)
        if args.out
        else (
            Path("/tmp/bench_cuda_dry_run")
            if dry
            else ROOT / "scripts" / "results" / f"cuda_pair_{slug(meta['gpu']['name'])}"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"meta": meta, "peaks": peaks, "pair": rows, "sweep": sweep_rows, "pipeline": pipeline, "failures": failures}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
    out.with_suffix(".md").write_text(markdown(doc))
    say(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    for prec, v in verdict.items():
        say(
            f"{prec}: fastest {v['fastest_path']} {v['fastest_config'] or ''} at {v['fastest_pct_of_gemm_peak']:.1f}% "
            f"of the same-precision GEMM peak"
            + (f"; ≥{TARGET_PCT_DGEMM:.0f}% DGEMM met by: {v['target_met_by'] or 'NONE'}" if prec == "fp64" else "")
        )
    for f in failures:
        say(f"FAILED{'' if f['counts'] else ' (swept configuration)'}: {f['what']}: {f['error']}")
    if any(f["counts"] for f in failures):
        sys.exit(1)
    return doc


def run_pipeline(xyz: str, device: str, say, failed) -> dict:
    """The whole pipeline on CUDA (CudaBackend, auto pair path) and on the CPU: stage timings and
    ΔE_corr. A device whose run fails gets an error entry (``failed`` records it)."""
    from dfmp2.interfaces.api import run
    from dfmp2.options import RunOptions

    out = {"molecule": xyz}
    for dev in (device, "cpu"):
        t0 = time.perf_counter()
        try:
            r = run(xyz, RunOptions(device=dev))
        except Exception as exc:
            out[dev] = {"error": failed(f"pipeline {xyz} on {dev}", exc)}
            say(f"pipeline {xyz} on {dev} FAILED: {out[dev]['error']}")
            continue
        out[dev] = {
            "seconds": time.perf_counter() - t0,
            "timings": r.timings,
            "e_corr": r.e_corr,
            "e_corr_hex": float.hex(r.e_corr),
            "e_hf": r.e_hf,
            "ran": r.ran,
            "shapes": {"nbasis": r.nbasis, "nocc": r.nocc, "nvir": r.nvir, "naux": r.naux},
        }
        say(
            f"pipeline {xyz} on {dev}: E_corr {r.e_corr:.12f} Eh, "
            + ", ".join(f"{k} {v:.2f}s" for k, v in r.timings.items())
        )
    if "e_corr" in out[device] and "e_corr" in out["cpu"]:
        out["abs_diff_e_corr"] = abs(out[device]["e_corr"] - out["cpu"]["e_corr"])
        say(f"pipeline |ΔE_corr| {device} vs cpu: {out['abs_diff_e_corr']:.2e} Eh")
    return out


def markdown(doc: dict) -> str:
    m, peaks = doc["meta"], doc["peaks"]
    g = m["gpu"]
    warn = "\n**CPU INTERPRETER DRY RUN: NOT A GPU MEASUREMENT.**\n" if m["dry_run_cpu"] else ""
    lines = [
        f"# MP2 pair step on CUDA: {g['name']}",
        warn,
        f"- date: {m['date']}",
        f"- GPU: {g['name']}"
        + "".join(
            f", {k} {g[k]}"
            for k in ("compute_capability", "sms", "memory_gib", "driver", "max_sm_clock", "power_limit")
            if k in g
        ),
        "- versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        f"- command: `{m['command']}`",
        f"- shape: nocc {m['shape']['nocc']}, nvir {m['shape']['nvir']}, naux {m['shape']['naux']} "
        f"({m['shape']['note']}); {m['pair_flops'] / 1e12:.3f} TFLOP = {m['flop_count']}; "
        f"occupied blocks: {m['occ_block']}; median of {m['repeats']} after a warm-up",
        f"- fp64 dot lowering (fused kernel PTX): {m.get('fp64_dot_lowering', 'n/a')}",
        "",
        "## GEMM peaks measured in this run (torch.matmul, square, TF32 off)",
        "",
        "| precision | TFLOP/s | n |",
        "|---|---:|---:|",
    ]
    for prec, p in peaks.items():
        lines.append(
            f"| {prec} | {p['tflops']:.2f} | {p['n']} |"
            if p.get("tflops")
            else f"| {prec} | failed: {_cell(p.get('error'))} | |"
        )
    lines += [
        "",
        "## Pair step",
        "",
        "| precision | path | config | median s | min s | max s | GFLOP/s | % of GEMM peak | abs ΔE vs torch / Eh | bits run to run | kernel |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in doc["pair"] + doc["sweep"]:
        cfg = (
            r["config"]
            if isinstance(r["config"], str) or r["config"] is None
            else ",".join(f"{k}={v}" for k, v in r["config"].items())
        )
        if r.get("gflops") is None:
            lines.append(f"| {r['precision']} | {r['path']} | {cfg or ''} | failed: {_cell(r['error'])} |||||||| |")
            continue
        lines.append(
            f"| {r['precision']} | {r['path']} | {cfg or ''} | {r['median_s']:.4f} | {r['min_s']:.4f} | "
            f"{r['max_s']:.4f} | {r['gflops']:.1f} | {r['pct_of_gemm_peak'] or float('nan'):.1f} | "
            f"{r.get('abs_diff_vs_torch', 0.0):.1e} | {'identical' if r['run_to_run_identical'] else 'DIFFER'} | "
            f"{'; '.join(k.split(':', 1)[1] for k in r['kernels'])} |"
        )
    lines += ["", "## Verdict", ""]
    for prec, v in m["verdict"].items():
        cfg = (
            v["fastest_config"]
            if isinstance(v["fastest_config"], str) or v["fastest_config"] is None
            else ",".join(f"{k}={x}" for k, x in v["fastest_config"].items())
        )
        line = (
            f"- {prec}: fastest CudaBackend path **{v['fastest_path']}** ({cfg or '-'}) at "
            f"{v['fastest_pct_of_gemm_peak']:.1f}% of the same-precision GEMM peak (torch unfused: "
            f"{v['torch_unfused_pct_of_gemm_peak'] or 0:.1f}%); recommended pair_path['{prec}'] = "
            f"'{v['recommended_pair_path']}'; the auto rule (linalg.cuda) takes '{v['auto_pair_path']}'"
            + (
                ""
                if v["auto_pair_path"] == v["recommended_pair_path"] or m["dry_run_cpu"]
                else " (**differs**: add this run to linalg.cuda.PAIR_PATH_MEASUREMENTS)"
            )
        )
        if prec == "fp64":
            line += (
                f"; target ≥ {v['target_pct_dgemm']:.0f}% of DGEMM met by: "
                f"{', '.join(v['target_met_by']) or '**none**'}"
            )
        lines.append(line)
    p = doc.get("pipeline")
    if p:
        lines += [
            "",
            f"## Whole pipeline: {p['molecule']}",
            "",
            "| device | E_corr / Eh | total s | stages (s) |",
            "|---|---:|---:|---|",
        ]
        for dev in [k for k in p if isinstance(p[k], dict)]:
            d = p[dev]
            if "error" in d:
                lines.append(f"| {dev} | failed: {_cell(d['error'])} | | |")
                continue
            lines.append(
                f"| {dev} | {d['e_corr']:.12f} | {d['seconds']:.1f} | "
                + ", ".join(f"{k} {v:.2f}" for k, v in d["timings"].items())
                + " |"
            )
        if "abs_diff_e_corr" in p:
            lines.append(f"\n|ΔE_corr| = {p['abs_diff_e_corr']:.2e} Eh")
    if doc.get("failures"):
        lines += ["", "## Failures (the other measurements ran)", ""]
        lines += [
            f"- {f['what']}{'' if f['counts'] else ' (swept configuration)'}: {f['error']}" for f in doc["failures"]
        ]
    return "\n".join(lines) + "\n"


def _cell(text) -> str:
    """Text for a markdown table cell (one line, no column separators)."""
    return " ".join(str(text).split()).replace("|", "\\|")


if __name__ == "__main__":
    main()
