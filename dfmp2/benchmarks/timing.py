"""Timing: warm-up, device synchronisation, repeats; median with min and max. GEMM peak of the
same run. Machine, library and load metadata kept with every result.

The timer is the one used by every benchmark in the project (scripts/bench_linalg.py,
``dfmp2 bench``): a result never comes from a different timing rule than its baseline.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import datetime, timezone


class Timer:
    """Time a callable: ``warmup`` untimed calls, then timed calls with the device synchronised
    before and after each, until at least ``repeats`` calls AND ``min_time`` seconds (at most
    ``max_repeats`` calls), but stop adding calls once ``max_time`` seconds were spent timing
    (at least one timed call always runs).

    ``expected_s`` (optional, per call): when the caller's estimate of one call exceeds
    ``single_above_s``, the call is run exactly once, untimed warm-up skipped: a minutes-long
    call gains nothing from a warm-up, and the report marks it (``warmup`` 0, ``repeats`` 1).

    Returns {median_s, min_s, max_s, repeats, warmup}.
    """

    def __init__(
        self,
        sync=lambda: None,
        warmup: int = 1,
        repeats: int = 3,
        min_time: float = 0.3,
        max_repeats: int = 50,
        max_time: float = float("inf"),
        single_above_s: float = float("inf"),
    ):
        self.sync, self.warmup, self.repeats, self.min_time = sync, warmup, repeats, min_time
        self.max_repeats, self.max_time, self.single_above_s = max_repeats, max_time, single_above_s

    def __call__(self, fn, expected_s: float | None = None, sync=None) -> dict:
        sync = sync or self.sync
        single = expected_s is not None and expected_s > self.single_above_s
        warmup = 0 if single else self.warmup
        for _ in range(warmup):
            fn()
        sync()
        times: list[float] = []
        total = 0.0
        while True:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            dt = time.perf_counter() - t0
            times.append(dt)
            total += dt
            if single or len(times) >= self.max_repeats or total >= self.max_time:
                break
            if len(times) >= self.repeats and total >= self.min_time:
                break
        return {
            "median_s": statistics.median(times),
            "min_s": min(times),
            "max_s": max(times),
            "repeats": len(times),
            "warmup": warmup,
        }


def gemm_peak(device, dtype, n: int, timer: Timer, sync=None, host: bool = False) -> dict:
    """The machine's measured GEMM peak: a square n x n product in ``dtype`` on ``device`` (median
    of the timer's repeats) by torch.matmul and, on the host CPU (``host``), by numpy's BLAS (OpenBLAS) on the
    same matrices: the peak is the faster library's, so a % of peak is against the best GEMM this
    machine ran, not against torch's alone. Returns {n, gflops, library, median_s, min_s, max_s,
    repeats, warmup, by_library: {library: GFLOP/s}}."""
    import torch

    from dfmp2.linalg import openblas, random_matrix

    a = random_matrix((n, n), 11, dtype=dtype, device=device)
    b = random_matrix((n, n), 12, dtype=dtype, device=device)
    runs = {"torch.matmul": timer(lambda: torch.matmul(a, b), sync=sync)}
    if host and openblas.numpy_blas_info() is not None:
        out = torch.empty((n, n), dtype=dtype)
        openblas.sync_threads()
        runs["numpy.matmul (OpenBLAS)"] = timer(lambda: openblas.openblas_matmul(a, b, out))
    gflops = {lib: 2.0 * n**3 / t["median_s"] / 1e9 for lib, t in runs.items()}
    best = max(gflops, key=gflops.get)
    return {"n": n, "gflops": gflops[best], "library": best, **runs[best], "by_library": gflops}


class OtherCPU:
    """CPU time taken by OTHER processes while this one runs: the busy time of all CPUs
    (/proc/stat: user, nice, system, irq, softirq) minus this process's own CPU time (os.times:
    every thread, and waited-for children), per second of wall time, i.e. in cores.

    The load average cannot tell this: a benchmark that runs 2 threads on 2 cores shows a load
    of 2 by itself. ``mark()`` returns a reading; ``cores(a, b)`` the other processes' mean cores
    between two readings (None where /proc/stat does not exist). Hypervisor steal time, which
    a shared VM also loses, is reported separately.
    """

    @staticmethod
    def mark() -> dict | None:
        from dfmp2.linalg.cpu_blas_probe import cpu_times  # the one /proc/stat reading

        return cpu_times()

    @staticmethod
    def cores(a: dict | None, b: dict | None) -> dict | None:
        """{other_cores, steal_cores, wall_s} between readings a and b (b later)."""
        if a is None or b is None or b["wall"] <= a["wall"]:
            return None
        wall = b["wall"] - a["wall"]
        other = ((b["busy"] - a["busy"]) - (b["own"] - a["own"])) / wall
        return {
            "other_cores": round(max(other, 0.0), 3),
            "steal_cores": round((b["steal"] - a["steal"]) / wall, 3),
            "wall_s": round(wall, 1),
        }


def cpu_model() -> str:
    """The CPU's model name (``linalg.cpu_blas.cpu_model``; imported here on use: torch)."""
    from dfmp2.linalg.cpu_blas import cpu_model as model

    return model()


def scipy_blas() -> str:
    import numpy as np

    try:
        cfg = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{cfg.get('name')} {cfg.get('version')}"
    except Exception:
        return "unknown"


def torch_blas() -> str:
    import torch

    cfg = torch.__config__.show()
    if "BLAS_INFO=" in cfg:
        return cfg.split("BLAS_INFO=", 1)[1].split(",", 1)[0]
    return "unknown"


def versions() -> dict:
    """Library versions that affect the timings."""
    import numpy
    import pyscf
    import scipy
    import torch

    import dfmp2

    v = {
        "dfmp2": dfmp2.__version__,
        "torch": torch.__version__,
        "torch_blas": torch_blas(),
        "numpy": numpy.__version__,
        "scipy": scipy.__version__,
        "scipy_blas": scipy_blas(),
        "pyscf": pyscf.__version__,
        "python": platform.python_version(),
    }
    try:
        import matplotlib

        v["matplotlib"] = matplotlib.__version__
    except ImportError:
        pass
    return v


def machine() -> dict:
    """Host, CPU model, core count, threads the libraries use, and the 1/5/15-minute load."""
    import torch
    from pyscf import lib

    m = {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "pyscf_threads": lib.num_threads(),
        "load_average": list(os.getloadavg()),
    }
    if torch.cuda.is_available():
        m["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return m


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_dfmp2(xyz, args: list, threads: int, timeout: float) -> dict:
    """One ``dfmp2 run XYZ ARGS -q --json`` in its own process (OMP/MKL threads ``threads``, its
    files in a temporary directory that is also its --scratch): {'wall_s', 'max_rss_mb' (the
    process's peak resident set, os.wait4), 'result' (its JSON)}, or {'error': the last stderr line
    or why, 'wall_s'} when it failed or ran past ``timeout`` s (killed)."""
    import json
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory(prefix="dfmp2-bench-") as tmp:
        out = Path(tmp) / "run.json"
        cmd = [sys.executable, "-m", "dfmp2", "run", str(xyz), *args, "-q", "--json", str(out), "--scratch", tmp]
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - t0 > timeout:
                p.kill()
                os.wait4(p.pid, 0)
                return {"error": f"timed out after {timeout:.0f} s"}
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        err = p.stderr.read().strip().splitlines()
        if os.waitstatus_to_exitcode(status) != 0:
            return {"error": err[-1] if err else f"exit {os.waitstatus_to_exitcode(status)}", "wall_s": wall}
        return {"wall_s": wall, "max_rss_mb": usage.ru_maxrss / 1e3, "result": json.loads(out.read_text())}


def time_mp2_stage(mol, auxmol, ref, options, backend=None, engine=None):
    """One run of the DF-MP2 stage after the SCF exactly as ``dfmp2 run`` runs it
    (``dfmp2.drivers.energy.mp2_after_scf``, the drop-in's call), as the benchmarks tabulate it:
    (seconds, e_os, e_ss, {stage: seconds}, ran), energies in Hartree."""
    from dfmp2.drivers.energy import mp2_after_scf

    done = mp2_after_scf(mol, auxmol, ref, options, backend, engine)
    return done.seconds, done.mp2.e_os, done.mp2.e_ss, done.timings, done.ran
