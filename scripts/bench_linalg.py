"""Per-op micro-benchmark of the linalg layer, with torch.linalg and scipy.linalg baselines.

    python scripts/bench_linalg.py --device cpu            # ~2-3 min on 2 cores
    python scripts/bench_linalg.py --device cuda --dtype fp32

For each op and shape: warm-up, then repeats (at least --repeats, until --min-time seconds),
device synchronised around every call; median, min and max time; GFLOP/s from the op's flop
count; and percent of the GEMM peak measured at the start of the same run in the same precision
(a large square torch.matmul). Baselines: the same op through torch / torch.linalg directly and
through scipy.linalg (CPU only; its BLAS is reported in the header). Writes
scripts/results/bench_linalg_<device>.json and .md.

Flop counts: gemm 2mkn; syrk n(n+1)k; trsm n^2 m (n: triangle, m: right-hand sides);
cholesky n^3/3; inv_sqrt_spd Newton–Schulz (3 iterations' GEMMs + 2) * 2n^3, counted from the
iterations it ran; inv_sqrt_spd eigh nominal (4/3 + 2 + 2) n^3 (tridiagonalisation, eigenvector
back-transformation, V diag V^T); mp2_pair_energy (symmetric block) nocc(nocc+1)/2 * 2 nvir^2 naux.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# numpy, scipy, torch and linalg are imported in _load() after the arguments are parsed, so that
# --threads reaches the BLAS thread pools (MKL for torch, OpenBLAS for scipy) before they start.
np = scipy = sla = torch = linalg = None
get_backend = random_matrix = random_spd = synthetic_problem = None


def _load():
    global np, scipy, sla, torch, linalg, get_backend, random_matrix, random_spd, synthetic_problem
    import numpy as np
    import scipy
    import scipy.linalg as sla
    import torch
    import linalg
    from linalg import get_backend, random_matrix, random_spd, synthetic_problem

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


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def scipy_blas() -> str:
    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:
        return "unknown"


def torch_blas() -> str:
    cfg = torch.__config__.show()
    for key in ("BLAS_INFO=", ):
        if key in cfg:
            return cfg.split(key, 1)[1].split(",", 1)[0]
    return "unknown"


class Timer:
    def __init__(self, sync, warmup: int, repeats: int, min_time: float, max_repeats: int = 50):
        self.sync, self.warmup, self.repeats, self.min_time, self.max_repeats = sync, warmup, repeats, min_time, max_repeats

    def __call__(self, fn):
        for _ in range(self.warmup):
            fn()
        self.sync()
        times, total = [], 0.0
        while len(times) < self.repeats or (total < self.min_time and len(times) < self.max_repeats):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.sync()
            dt = time.perf_counter() - t0
            times.append(dt)
            total += dt
        return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "repeats": len(times)}


def cases(op, shape, dtype, be, on_cpu):
    """(flops, our_fn, baselines {name: fn}, extra) for one op and shape."""
    dev = be.device
    np_dt = np.float64 if dtype == torch.float64 else np.float32
    if op == "gemm":
        m, k, n = shape
        a, b = random_matrix((m, k), 1, dtype=dtype, device=dev), random_matrix((k, n), 2, dtype=dtype, device=dev)
        an, bn = a.cpu().numpy(), b.cpu().numpy()
        return 2.0 * m * k * n, lambda: linalg.gemm(a, b, backend=be), {
            "torch": lambda: torch.matmul(a, b),
            "scipy": (lambda: sla.blas.get_blas_funcs("gemm", (an,))(1.0, an, bn)) if on_cpu else None}, {}
    if op == "syrk":
        n, k = shape
        a = random_matrix((n, k), 3, dtype=dtype, device=dev)
        an = np.asfortranarray(a.cpu().numpy())
        return float(n) * (n + 1) * k, lambda: linalg.syrk(a, backend=be), {
            "torch": lambda: torch.matmul(a, a.mT),
            "scipy": (lambda: sla.blas.get_blas_funcs("syrk", (an,))(1.0, an, lower=1)) if on_cpu else None}, {}
    if op == "trsm":
        n, m = shape
        L = torch.linalg.cholesky(random_spd(n, 1e3, 4, dtype=torch.float64)).to(dtype).to(dev)
        b = random_matrix((n, m), 5, dtype=dtype, device=dev)
        Ln, bn = L.cpu().numpy(), b.cpu().numpy()
        return float(n) * n * m, lambda: linalg.trsm(L, b, backend=be), {
            "torch": lambda: torch.linalg.solve_triangular(L, b, upper=False),
            "scipy": (lambda: sla.solve_triangular(Ln, bn, lower=True, check_finite=False)) if on_cpu else None}, {}
    if op == "cholesky":
        (n,) = shape
        s = random_spd(n, 1e4, 6, dtype=dtype, device=dev)
        sn = s.cpu().numpy()
        return n ** 3 / 3.0, lambda: linalg.cholesky(s, backend=be), {
            "torch": lambda: torch.linalg.cholesky(s),
            "scipy": (lambda: sla.cholesky(sn, lower=True, check_finite=False)) if on_cpu else None}, {}
    if op in ("inv_sqrt_eigh", "inv_sqrt_newton_schulz"):
        (n,) = shape
        s = random_spd(n, 1e6 if dtype == torch.float64 else 1e3, 7, dtype=dtype, device=dev)
        sn = s.cpu().numpy()

        def torch_eigh():
            w, v = torch.linalg.eigh(s)
            return (v * w.rsqrt()) @ v.mT

        def scipy_eigh():
            w, v = sla.eigh(sn, check_finite=False)
            return (v / np.sqrt(w)) @ v.T

        base = {"torch": torch_eigh, "scipy": scipy_eigh if on_cpu else None}
        if op == "inv_sqrt_eigh":
            return (4.0 / 3 + 4.0) * n ** 3, lambda: linalg.inv_sqrt_spd(s, backend=be), base, {}
        _, info = linalg.inv_sqrt_spd(s, method="newton_schulz", backend=get_backend(be.name))
        flops = (3 * info["iterations"] + 2) * 2.0 * n ** 3
        return flops, lambda: linalg.inv_sqrt_spd(s, method="newton_schulz", backend=be), base, {
            "iterations": info["iterations"], "residual": info["residual"], "baseline_flops": (4.0 / 3 + 4.0) * n ** 3,
            "baseline_note": "baselines: eigh-based A^-1/2 (same result, other algorithm; nominal eigh flops)"}
    if op == "mp2_pair_energy":
        nocc, nvir, naux = shape
        p = synthetic_problem(nocc, nvir, naux, seed=8, dtype=dtype, device=dev)
        B = p.B

        def einsum_ref():
            K = torch.einsum("iaP,jbP->ijab", B, B).to(torch.float64)
            D = p.eps_occ[:, None, None, None] + p.eps_occ[None, :, None, None] - p.eps_vir[:, None] - p.eps_vir
            return float((K * (2 * K - K.transpose(2, 3)) / D).sum())

        flops = nocc * (nocc + 1) / 2 * 2.0 * nvir * nvir * naux
        return flops, lambda: linalg.mp2_pair_energy(B, B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True,
                                                     backend=be), {"torch": einsum_ref, "scipy": None}, {
            "baseline_flops": nocc * nocc * 2.0 * nvir * nvir * naux,
            "baseline_note": "torch baseline: one einsum over all nocc^2 pairs (no i >= j symmetry)"}
    raise ValueError(op)


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
    if args.threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(args.threads)
    _load()
    if args.threads:
        torch.set_num_threads(args.threads)
    DTYPES = {"fp64": torch.float64, "fp32": torch.float32}

    try:
        be = get_backend(args.device)             # before any work: a device that cannot run is one line
    except (linalg.DeviceUnavailableError, ValueError) as e:
        raise SystemExit(f"bench_linalg: {e}") from None
    on_cpu = be.device.type == "cpu"
    timer = Timer(be.synchronize, args.warmup, args.repeats, args.min_time)
    shapes = QUICK if args.quick else SHAPES
    ops = [o for o in args.ops.split(",") if o]
    for o in ops:
        if o not in SHAPES:
            raise SystemExit(f"unknown op {o!r}; choose from {', '.join(SHAPES)}")
    meta = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": args.device,
            "backend": be.describe(), "torch": torch.__version__, "torch_blas": torch_blas(),
            "torch_threads": torch.get_num_threads(), "numpy": np.__version__, "scipy": scipy.__version__,
            "scipy_blas": scipy_blas(), "cpu": cpu_model(), "python": platform.python_version(),
            "host": platform.node(), "command": " ".join(["python", "scripts/bench_linalg.py"] + (argv or sys.argv[1:])),
            "warmup": args.warmup, "min_repeats": args.repeats, "min_time_s": args.min_time,
            "load_average_before": os.getloadavg(), "cpu_count": os.cpu_count()}
    if be.device.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(be.device)
    print(json.dumps(meta, indent=1), flush=True)

    peaks, rows = {}, []
    for dname in args.dtype.split(","):
        dtype = DTYPES[dname]
        n = args.peak_n or (256 if args.quick else (2048 if on_cpu else 8192))
        a, b = random_matrix((n, n), 11, dtype=dtype, device=be.device), random_matrix((n, n), 12, dtype=dtype, device=be.device)
        t = timer(lambda: torch.matmul(a, b))
        peaks[dname] = {"n": n, "gflops": 2.0 * n ** 3 / t["median_s"] / 1e9, **t}
        print(f"GEMM peak {dname}: n={n} {peaks[dname]['gflops']:.1f} GFLOP/s", flush=True)
        del a, b
        for op in ops:
            for shape in shapes[op]:
                flops, ours, bases, extra = cases(op, shape, dtype, be, on_cpu)
                row = {"op": op, "shape": list(shape), "dtype": dname, "flops": flops, **extra}
                row["linalg"] = timer(ours)
                for name, fn in bases.items():
                    row[name] = timer(fn) if fn is not None else None
                derive(row, peaks)
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


def derive(row, peaks):
    """GFLOP/s and % of the same-precision GEMM peak for each column (baselines with their own flops)."""
    for name in ("linalg", "torch", "scipy"):
        if row.get(name):
            flops = row["flops"] if name == "linalg" else row.get("baseline_flops", row["flops"])
            row[name]["gflops"] = flops / row[name]["median_s"] / 1e9
            row[name]["pct_peak"] = 100.0 * row[name]["gflops"] / peaks[row["dtype"]]["gflops"]


def rerender(path: str):
    """Recompute the derived columns of a saved JSON and rewrite it and its .md (no timing)."""
    data = json.loads(Path(path).read_text())
    for row in data["rows"]:
        op, shape = row["op"], row["shape"]
        if op == "inv_sqrt_newton_schulz":
            row["baseline_flops"] = (4.0 / 3 + 4.0) * shape[0] ** 3
            row["baseline_note"] = "baselines: eigh-based A^-1/2 (same result, other algorithm; nominal eigh flops)"
        elif op == "mp2_pair_energy":
            nocc, nvir, naux = shape
            row["baseline_flops"] = nocc * nocc * 2.0 * nvir * nvir * naux
            row["baseline_note"] = "torch baseline: one einsum over all nocc^2 pairs (no i >= j symmetry)"
        derive(row, data["peak"])
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
             "", "Times are medians in ms (min-max in the JSON); GFLOP/s from the op's flop count (see the script's "
             "docstring); % peak = linalg GFLOP/s / GEMM peak in the same precision.", "",
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
