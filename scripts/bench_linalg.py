"""Per-op micro-benchmark of the linalg layer, with torch.linalg and scipy.linalg baselines.

    python scripts/bench_linalg.py --device cpu            # ~2-3 min on 2 cores
    python scripts/bench_linalg.py --device cuda --dtype fp32
    python scripts/bench_linalg.py --blas                  # torch's BLAS vs numpy's OpenBLAS, ~2-4 min

--blas: the best (of --repeats, default 3) DGEMM and SGEMM of torch's BLAS and of numpy's OpenBLAS
(zero-copy np.matmul, linalg.cpu_blas) at 2000-4000 cubed and at the GEMM/SYRK shapes of the DF-SCF's
K build, the MP2 transform and the pair step (one thread per row, as it runs) of (H2O)8 and (H2O)16
cc-pVDZ, each with the library linalg.cpu_blas's probe picks for it on this machine. Writes
scripts/results/blas_cpu.json and .md (date, CPU, versions, threadpoolctl's record).

For each op and shape: warm-up, then repeats (at least --repeats, until --min-time seconds),
device synchronised around every call; median, min and max time; GFLOP/s from the op's flop
count; and percent of the GEMM peak measured at the start of the same run in the same precision
(a large square torch.matmul). Baselines: the same op through torch / torch.linalg directly and
through scipy.linalg (CPU only; its BLAS is reported in the header). Writes
scripts/results/linalg_<device>.json and .md.

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
QUICK = {
    "gemm": [(1, 1, 1), (127, 129, 131), (256, 256, 256)],
    "syrk": [(300, 40)],
    "trsm": [(200, 100)],
    "cholesky": [(200,)],
    "inv_sqrt_eigh": [(100,)],
    "inv_sqrt_newton_schulz": [(100,)],
    "mp2_pair_energy": [(4, 30, 60)],
}
BASELINE_NOTES = {
    "inv_sqrt_newton_schulz": "baselines: eigh-based A^-1/2 (same result, other algorithm; nominal eigh flops)",
    "mp2_pair_energy": "torch baseline: one einsum over all nocc^2 pairs (no i >= j symmetry)",
}


def main(argv=None):  # noqa: C901
    ap = argparse.ArgumentParser(description="linalg per-op micro-benchmark")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    ap.add_argument("--dtype", default="fp64,fp32", help="comma list of fp64, fp32")
    ap.add_argument("--ops", default=",".join(SHAPES), help="comma list of ops")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="minimum timed repeats")
    ap.add_argument("--min-time", type=float, default=0.3, help="keep repeating until this many seconds")
    ap.add_argument(
        "--peak-n", type=int, default=None, help="size of the square GEMM for the peak (cpu 2048, cuda 8192)"
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="BLAS/torch threads for all columns (default: the libraries' defaults)",
    )
    ap.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    ap.add_argument("--out", default=None, help="output prefix (default scripts/results/linalg_<device>)")
    ap.add_argument(
        "--blas",
        action="store_true",
        help="torch's BLAS vs numpy's OpenBLAS at large and DF-MP2 shapes (see the docstring)",
    )
    ap.add_argument(
        "--rerender",
        metavar="JSON",
        default=None,
        help="only recompute derived columns of a saved result and rewrite its .json/.md",
    )
    args = ap.parse_args(argv)
    if args.rerender:
        return rerender(args.rerender)
    if args.blas:
        return blas_main(args, argv)
    # Before numpy/scipy/torch are imported (by the library below), so that --threads reaches the
    # BLAS thread pools (MKL for torch, OpenBLAS for scipy) before they start.
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    import torch

    from dfmp2 import linalg
    from dfmp2.benchmarks import ops as bops
    from dfmp2.benchmarks import timing

    if args.threads:
        torch.set_num_threads(args.threads)
    DTYPES = {"fp64": torch.float64, "fp32": torch.float32}

    try:
        be = linalg.get_backend(args.device)  # before any work: a device that cannot run is one line
    except (linalg.DeviceUnavailableError, ValueError) as e:
        raise SystemExit(f"bench_linalg: {e}") from None
    on_cpu = be.caps.is_host  # host baselines (scipy) time this same device
    timer = timing.Timer(be.synchronize, args.warmup, args.repeats, args.min_time)
    shapes = QUICK if args.quick else SHAPES
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in SHAPES:
            raise SystemExit(f"unknown op {o!r}; choose from {', '.join(SHAPES)}")
    v = timing.versions()
    meta = {
        "date": timing.now(),
        "device": args.device,
        "backend": be.describe(),
        "torch": v["torch"],
        "torch_blas": v["torch_blas"],
        "torch_threads": torch.get_num_threads(),
        "numpy": v["numpy"],
        "scipy": v["scipy"],
        "scipy_blas": v["scipy_blas"],
        "cpu": timing.cpu_model(),
        "python": platform.python_version(),
        "host": platform.node(),
        "command": " ".join(["python", "scripts/bench_linalg.py"] + (argv or sys.argv[1:])),
        "warmup": args.warmup,
        "min_repeats": args.repeats,
        "min_time_s": args.min_time,
        "load_average_before": os.getloadavg(),
        "cpu_count": os.cpu_count(),
    }
    if "gpu" in meta["backend"]:
        meta["gpu"] = meta["backend"]["gpu"]
    print(json.dumps(meta, indent=1), flush=True)

    peaks, rows = {}, []
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        n = args.peak_n or (256 if args.quick else (2048 if on_cpu else 8192))
        peaks[dname] = timing.gemm_peak(be.device, dtype, n, timer, host=on_cpu)
        print(f"GEMM peak {dname}: n={n} {peaks[dname]['gflops']:.1f} GFLOP/s ({peaks[dname]['library']})", flush=True)
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
                print(
                    f"{dname} {op:24s} {tuple(shape)!s:18s} {r['median_s'] * 1e3:9.3f} ms  "
                    f"{r['gflops']:8.2f} GFLOP/s  {r['pct_peak']:5.1f}% peak",
                    flush=True,
                )
    meta["kernels"] = be.describe()["kernels"]
    meta["load_average_after"] = os.getloadavg()

    dev_tag = args.device.split(":")[0]
    prefix = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / f"linalg_{dev_tag}"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "peak": peaks, "rows": rows}, indent=1))
    prefix.with_suffix(".md").write_text(markdown(meta, peaks, rows))
    print(f"wrote {prefix.with_suffix('.json')} and .md")


def blas_shapes(quick: bool = False) -> list[tuple]:
    """(name, op, m, n, k, threads) rows: 'gemm' is (m, k) @ (k, n); 'syrk' is a^T a for a (k, n)
    (m = n); threads None means torch's count, 1 the pair step's one thread per row. The DF-MP2
    shapes are derived from the code's block sizes: per water cc-pVDZ nao 24, nocc 5, MP2-fit naux
    84, JK-fit naux 116; the pair step's K = (nvir, naux) @ (naux, cols) with cols =
    min(OCC_BLOCK_MAX, PAIR_CHUNK_ELEMS // nvir^2) * nvir; the K build's Z = C_occ^T B_P (nocc, nao)
    @ (nao, nb*nao) and its SYRK over k = nocc*nb for nb = jk.jk_block; the transform
    (naux*nao, nao) @ (nao, nocc) and (naux*nocc, nao) @ (nao, nvir)."""
    from dfmp2 import memory
    from dfmp2.linalg.torch_ops import PAIR_CHUNK_ELEMS
    from dfmp2.scf import jk

    if quick:
        return [("cube 256", "gemm", 256, 256, 256, None), ("pair quick", "gemm", 40, 120, 160, 1)]
    rows = [(f"cube {n}", "gemm", n, n, n, None) for n in (2000, 3000, 4000)]
    for nw in (8, 16):
        nao, nocc, naux, naux_jk = 24 * nw, 5 * nw, 84 * nw, 116 * nw
        nvir = nao - nocc
        cols = min(memory.OCC_BLOCK_MAX, PAIR_CHUNK_ELEMS // (nvir * nvir)) * nvir
        nb = min(naux_jk, jk.jk_block(nao, naux_jk, 8))
        tag = f"(H2O){nw}"
        rows += [
            (f"{tag} pair K_ij", "gemm", nvir, cols, naux, 1),
            (f"{tag} SCF K: Z = C^T B", "gemm", nocc, nb * nao, nao, None),
            (f"{tag} SCF K: Z^T Z", "syrk", nao, nao, nocc * nb, None),
            (f"{tag} transform (P mu|i)", "gemm", naux * nao, nocc, nao, None),
            (f"{tag} transform (P i|a)", "gemm", naux * nocc, nvir, nao, None),
        ]
    return rows


def blas_main(args, argv):
    """--blas: best-of-N GEMM/SYRK of both libraries per shape and dtype, with the probe's pick."""
    import time

    import torch

    from dfmp2.benchmarks import timing
    from dfmp2.linalg import cpu_blas, openblas, torch_ops

    v = timing.versions()
    threads = torch.get_num_threads()
    table, source, _ = cpu_blas.CpuBlas("auto").table()
    from threadpoolctl import threadpool_info

    meta = {
        "date": timing.now(),
        "cpu": timing.cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": threads,
        "torch": v["torch"],
        "torch_blas": openblas.torch_blas_info(),
        "numpy": v["numpy"],
        "openblas": openblas.numpy_blas_info(),
        "threadpool_info": threadpool_info(),
        "probe": {
            "source": source,
            "seconds": table["seconds"],
            "date": table["date"],
            "cache": str(cpu_blas.cache_path()),
        },
        "command": " ".join(["python", "scripts/bench_linalg.py"] + list(argv if argv is not None else sys.argv[1:])),
        "repeats": args.repeats,
        "load_average_before": os.getloadavg(),
    }
    print(
        json.dumps({k: meta[k] for k in ("date", "cpu", "torch_threads", "torch_blas", "openblas", "probe")}, indent=1),
        flush=True,
    )
    rows = []
    for name, op, m, n, k, nt in blas_shapes(args.quick):
        for dname, dtype in (("fp64", torch.float64), ("fp32", torch.float32)):
            g = torch.Generator().manual_seed(1)
            A = torch.rand((k, n) if op == "syrk" else (m, k), generator=g, dtype=dtype)
            B = A if op == "syrk" else torch.rand((k, n), generator=g, dtype=dtype)
            out = torch.empty((m, n), dtype=dtype)
            fns = {
                "torch": (lambda: torch_ops.syrk(A, trans=True))
                if op == "syrk"
                else (lambda: torch.matmul(A, B, out=out)),
                "openblas": (lambda: openblas.openblas_matmul(A.mT, A, out))
                if op == "syrk"
                else (lambda: openblas.openblas_matmul(A, B, out)),
            }
            best = {lib: float("inf") for lib in fns}
            torch.set_num_threads(nt or threads)
            openblas._THREADS.sync(nt or threads)
            try:
                for fn in fns.values():
                    fn()
                for _ in range(args.repeats):  # interleaved: load hits both libraries alike
                    for lib, fn in fns.items():
                        t0 = time.perf_counter()
                        fn()
                        best[lib] = min(best[lib], time.perf_counter() - t0)
            finally:
                torch.set_num_threads(threads)
                openblas._THREADS.sync(threads)
            flops = 2.0 * m * n * k
            kind = "pair" if nt == 1 else op
            pick = cpu_blas.CpuBlas("auto").library(kind, dtype, flops)
            row = {
                "name": name,
                "op": op,
                "m": m,
                "n": n,
                "k": k,
                "threads": nt or threads,
                "dtype": dname,
                "flops": flops,
                "seconds": best,
                "gflops": {lib: flops / t / 1e9 for lib, t in best.items()},
                "faster": min(best, key=best.get),
                "probe_class": cpu_blas.entry(kind, dtype, cpu_blas.size_class(flops)),
                "probe_pick": pick,
            }
            rows.append(row)
            print(
                f"{name:28s} {op} {m}x{n}x{k} {dname} t={row['threads']}: torch {row['gflops']['torch']:7.1f}  "
                f"openblas {row['gflops']['openblas']:7.1f} GF/s  faster {row['faster']:8s} probe picks {pick}",
                flush=True,
            )
    meta["load_average_after"] = os.getloadavg()
    prefix = Path(args.out) if args.out else Path(__file__).resolve().parent / "results" / "blas_cpu"
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps({"meta": meta, "probe_table": table, "rows": rows}, indent=1))
    prefix.with_suffix(".md").write_text(blas_markdown(meta, rows))
    print(f"wrote {prefix.with_suffix('.json')} and .md")


def blas_markdown(meta, rows) -> str:
    ob, tb = meta["openblas"] or {}, meta["torch_blas"]
    lines = [
        "# torch's BLAS vs numpy's OpenBLAS",
        "",
        f"`{meta['command']}` on {meta['date']}: {meta['cpu']} ({meta['cpu_count']} CPUs), torch "
        f"{meta['torch']} ({tb['library']} {tb['version']}), numpy {meta['numpy']} (OpenBLAS {ob.get('version')}, "
        f"core type {ob.get('architecture')}, {ob.get('threading_layer')}), {meta['torch_threads']} threads. "
        f"Load average before/after: {meta['load_average_before'][0]:.1f} / {meta['load_average_after'][0]:.1f}. "
        f"Probe table: {meta['probe']['source']} ({meta['probe']['seconds']} s on {meta['probe']['date']}).",
        "",
        "Best of the repeats, both libraries interleaved; GF/s = 2mnk / time (SYRK: of the full product).",
        "",
        "| shape | op | m x n x k | dtype | threads | torch GF/s | OpenBLAS GF/s | faster | probe class | probe picks |",
        "|---|---|---|---|---:|---:|---:|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['op']} | {r['m']}x{r['n']}x{r['k']} | {r['dtype']} | {r['threads']} | "
            f"{r['gflops']['torch']:.1f} | {r['gflops']['openblas']:.1f} | {r['faster']} | "
            f"{r['probe_class']} | {r['probe_pick']} |"
        )
    return "\n".join(lines) + "\n"


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

    lines = [
        "# linalg micro-benchmark",
        "",
        f"`{meta['command']}` on {meta['date']}: {meta.get('gpu', meta['cpu'])}, torch {meta['torch']} "
        f"({meta['torch_blas']}, threads={meta['torch_threads']}), scipy {meta['scipy']} ({meta['scipy_blas']}); "
        f"backend {meta['backend']['device']} / {meta['backend']['engine']}. Load average before/after: "
        f"{meta['load_average_before'][0]:.1f} / {meta['load_average_after'][0]:.1f} on {meta['cpu_count']} CPUs.",
        "",
        "Kernels that ran (linalg column): " + ", ".join(f"`{k}` x{v}" for k, v in meta["kernels"].items()),
        "",
        "GEMM peak of this run (square torch.matmul, median): "
        + "; ".join(f"{d}: n={p['n']}, {p['gflops']:.1f} GFLOP/s" for d, p in peaks.items()),
        "",
        "Times are medians in ms (min-max in the JSON); GFLOP/s from the op's flop count (see "
        "dfmp2/benchmarks/ops.py); % peak = linalg GFLOP/s / GEMM peak in the same precision.",
        "",
        "| op | shape | dtype | linalg ms | GFLOP/s | % peak | torch ms | torch GFLOP/s | scipy ms | scipy GFLOP/s | note |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        note = r.get("baseline_note", "")
        if "iterations" in r:
            note = f"{r['iterations']} iterations, residual {r['residual']:.1e}; " + note
        lines.append(
            f"| {r['op']} | {'x'.join(map(str, r['shape']))} | {r['dtype']} | {t(r['linalg'])} | "
            f"{g(r['linalg'])} | {r['linalg']['pct_peak']:.1f} | {t(r.get('torch'))} | {g(r.get('torch'))} | "
            f"{t(r.get('scipy'))} | {g(r.get('scipy'))} | {note} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
