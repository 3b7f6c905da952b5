"""Per-op micro-benchmark of the linalg layer, with torch.linalg and scipy.linalg baselines.

    python scripts/bench_linalg.py --device cpu            # ~2-3 min on 2 cores
    python scripts/bench_linalg.py --device cuda --dtype fp32

For each op and shape: warm-up, then repeats (at least --repeats, until --min-time seconds),
device synchronised around every call; median, min and max time; GFLOP/s from the op's flop
count; and percent of the GEMM peak measured at the start of the same run in the same precision
(a large square torch.matmul). Baselines: the same op through torch / torch.linalg directly and
through scipy.linalg (CPU only; its BLAS is reported in the header). Writes
scripts/results/bench_linalg_<device>.json and .md.

The timer, the GEMM peak, the op cases with their flop counts and baselines are those of
``dfmp2 bench`` (dfmp2/benchmarks/timing.py and ops.py; flop counts in ops.py's docstring): this
script only chooses square-ish shapes and writes its own table. For per-shape DF-MP2 reports
(with PySCF baselines, water clusters and Trainium estimates) use ``dfmp2 bench``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# Default shapes: small/odd sizes, DF-MP2-like rectangular ones, and a few large squares.
SHAPES = {
    "gemm": [(1, 1, 1), (127, 129, 131), (512, 512, 512), (1000, 300, 1000), (2000, 200, 60), (1536, 1536, 1536)],
    "syrk": [(256, 64), (1000, 300), (2000, 500)],
    "trsm": [(500, 1000), (1000, 2000)],
    "cholesky": [(500,), (1000,), (2000,)],
    "inv_sqrt_eigh": [(500,), (1000,)],
    "inv_sqrt_newton_schulz": [(500,), (1000,)],
    "mp2_pair_energy": [(16, 200, 600)],
}
QUICK = {"gemm": [(1, 1, 1), (127, 129, 131), (256, 256, 256)], "syrk": [(300, 40)], "trsm": [(200, 100)],
         "cholesky": [(200,)], "inv_sqrt_eigh": [(100,)], "inv_sqrt_newton_schulz": [(100,)],
         "mp2_pair_energy": [(4, 30, 60)]}
BASELINE_NOTES = {
    "inv_sqrt_newton_schulz": "baselines: eigh-based A^-1/2 (same result, other algorithm; nominal eigh flops)",
    "mp2_pair_energy": "torch baseline: one einsum over all nocc^2 pairs (no i >= j symmetry)"}


def main(argv=None):
    ap = argparse.ArgumentParser(description="linalg per-op micro-benchmark")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="fp64,fp32", help="comma list of fp64, fp32")
    ap.add_argument("--ops", default=",".join(SHAPES), help="comma list of ops")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="minimum timed repeats")
    ap.add_argument("--min-time", type=float, default=0.3, help="keep repeating until this many seconds")
    ap.add_argument("--peak-n", type=int, default=None, help="size of the square GEMM for the peak (cpu 2048, cuda 8192)")
    ap.add_argument("--threads", type=int, default=None,
                    help="BLAS/torch threads for all columns (default: the libraries' defaults)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--out", default=None, help="output prefix (default scripts/results/bench_linalg_<device>)")
    ap.add_argument("--rerender", metavar="JSON", default=None,
                    help="only recompute derived columns of a saved result and rewrite its .json/.md")
    args = ap.parse_args(argv)
    if args.rerender:
        return rerender(args.rerender)
    # Before numpy/scipy/torch are imported (by the library below), so that --threads reaches the
    # BLAS thread pools (MKL for torch, OpenBLAS for scipy) before they start.
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import torch
    import linalg
    from dfmp2.benchmarks import ops as bops, timing
    if args.threads:
        torch.set_num_threads(args.threads)
    DTYPES = {"fp64": torch.float64, "fp32": torch.float32}

    try:
        be = linalg.get_backend(args.device)     # before any work: a device that cannot run is one line
    except (linalg.DeviceUnavailableError, ValueError) as e:
        raise SystemExit(f"bench_linalg: {e}") from None
    on_cpu = be.caps.is_host                 # host baselines (scipy) time this same device
    timer = timing.Timer(be.synchronize, args.warmup, args.repeats, args.min_time)
    shapes = QUICK if args.quick else SHAPES
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in SHAPES:
            raise SystemExit(f"unknown op {o!r}; choose from {', '.join(SHAPES)}")
    v = timing.versions()
    meta = {"date": timing.now(), "device": args.device,
            "backend": be.describe(), "torch": v["torch"], "torch_blas": v["torch_blas"],
            "torch_threads": torch.get_num_threads(), "numpy": v["numpy"], "scipy": v["scipy"],
            "scipy_blas": v["scipy_blas"], "cpu": timing.cpu_model(), "python": platform.python_version(),
            "host": platform.node(), "command": " ".join(["python", "scripts/bench_linalg.py"] + (argv or sys.argv[1:])),
            "warmup": args.warmup, "min_repeats": args.repeats, "min_time_s": args.min_time,
            "load_average_before": os.getloadavg(), "cpu_count": os.cpu_count()}
    if "gpu" in meta["backend"]:
        meta["gpu"] = meta["backend"]["gpu"]
    print(json.dumps(meta, indent=1), flush=True)

    peaks, rows = {}, []
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        n = args.peak_n or (256 if args.quick else (2048 if on_cpu else 8192))
        peaks[dname] = timing.gemm_peak(be.device, dtype, n, timer)
        print(f"GEMM peak {dname}: n={n} {peaks[dname]['gflops']:.1f} GFLOP/s", flush=True)
        for op in ops:
            for shape in shapes[op]:
                case = bops.make_case(op, shape, dtype, be, pyscf_baseline=False)
                t = timer(case.ours)
                case.settle()
                row = {"op": op, "shape": list(shape), "dtype": dname, "flops": case.flops, **case.extra}
                if case.baseline_flops:
                    row["baseline_flops"] = case.baseline_flops
                if op in BASELINE_NOTES:
                    row["baseline_note"] = BASELINE_NOTES[op]
                row["linalg"] = t
                for name in ("torch", "scipy"):
                    fn = case.baselines.get(name)
                    row[name] = timer(fn) if callable(fn) else None
                bops.derive(row, peaks[dname]["gflops"], columns=("linalg", "torch", "scipy"))
                rows.append(row)
                r = row["linalg"]
                print(f"{dname} {op:24s} {str(tuple(shape)):18s} {r['median_s'] * 1e3:9.3f} ms  "
                      f"{r['gflops']:8.2f} GFLOP/s  {r['pct_peak']:5.1f}% peak", flush=True)
    meta["kernels"] = be.describe()["kernels"]
    meta["load_average_after"] = os.getloadavg()

    dev_tag = args.device.split(":")[0]
    prefix = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / f"bench_linalg_{dev_tag}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "peak": peaks, "rows": rows}, indent=1))
    prefix.with_suffix(".md").write_text(markdown(meta, peaks, rows))
    print(f"wrote {prefix.with_suffix('.json')} and .md")


def rerender(path: str):
    """Recompute the derived columns of a saved JSON and rewrite it and its .md (no timing)."""
    from dfmp2.benchmarks import ops as bops
    data = json.loads(Path(path).read_text())
    for row in data["rows"]:
        op, shape = row["op"], row["shape"]
        if op == "inv_sqrt_newton_schulz":
            f = bops.flops("inv_sqrt_eigh", shape)
            row["baseline_flops"] = {"torch": f, "scipy": f}
        elif op == "mp2_pair_energy":
            nocc, nvir, naux = shape
            row["baseline_flops"] = {"torch": nocc * nocc * 2.0 * nvir * nvir * naux}
        if op in BASELINE_NOTES:
            row["baseline_note"] = BASELINE_NOTES[op]
        bops.derive(row, data["peak"][row["dtype"]]["gflops"], columns=("linalg", "torch", "scipy"))
    Path(path).write_text(json.dumps(data, indent=1))
    Path(path).with_suffix(".md").write_text(markdown(data["meta"], data["peak"], data["rows"]))
    print(f"rewrote {path} and its .md")


def markdown(meta, peaks, rows) -> str:
    def t(r):
        return "n/a" if not r else f"{r['median_s'] * 1e3:.3f}"

    def g(r):
        return "n/a" if not r else f"{r['gflops']:.2f}"

    lines = ["# linalg micro-benchmark", "",
             f"`{meta['command']}` on {meta['date']}: {meta.get('gpu', meta['cpu'])}, torch {meta['torch']} "
             f"({meta['torch_blas']}, threads={meta['torch_threads']}), scipy {meta['scipy']} ({meta['scipy_blas']}); "
             f"backend {meta['backend']['device']} / {meta['backend']['engine']}. Load average before/after: "
             f"{meta['load_average_before'][0]:.1f} / {meta['load_average_after'][0]:.1f} on {meta['cpu_count']} CPUs.",
             "", "Kernels that ran (linalg column): " + ", ".join(f"`{k}` x{v}" for k, v in meta["kernels"].items()),
             "", "GEMM peak of this run (square torch.matmul, median): " +
             "; ".join(f"{d}: n={p['n']}, {p['gflops']:.1f} GFLOP/s" for d, p in peaks.items()),
             "", "Times are medians in ms (min-max in the JSON); GFLOP/s from the op's flop count (see "
             "dfmp2/benchmarks/ops.py); % peak = linalg GFLOP/s / GEMM peak in the same precision.", "",
             "| op | shape | dtype | linalg ms | GFLOP/s | % peak | torch ms | torch GFLOP/s | scipy ms | scipy GFLOP/s | note |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        note = r.get("baseline_note", "")
        if "iterations" in r:
            note = f"{r['iterations']} iterations, residual {r['residual']:.1e}; " + note
        lines.append(f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | {t(r['linalg'])} | "
                     f"{g(r['linalg'])} | {r['linalg']['pct_peak']:.1f} | {t(r.get('torch'))} | {g(r.get('torch'))} | "
                     f"{t(r.get('scipy'))} | {g(r.get('scipy'))} | {note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
