"""The CPU's BLAS for GEMM, SYRK and the MP2 pair step's GEMM: torch's own (MKL in the x86 wheels)
or the OpenBLAS numpy ships (``np.matmul``), chosen per op, dtype and size class by measurement.

Why: on AMD EPYC numpy's OpenBLAS runs large DGEMM/SGEMM markedly faster than torch's MKL, while
torch wins some smaller shapes; on an Intel CPU MKL may win everywhere. So nothing is decided by
vendor: ``mode='auto'`` measures (``probe``) and caches the table in
``$XDG_CACHE_HOME/dfmp2/cpu_blas.json`` (or ``~/.cache/dfmp2/``) under a key of CPU model, thread
count and library versions (``cache_key``). ``mode='torch'`` or ``'openblas'`` forces one library
for every op (the user's choice, recorded as such).

The probe must not be fooled: single calls of a few ms varied so much that quiet
probes disagreed, and a probe taken while other processes ran was cached for good. So each
class is timed on the run's own layouts in samples of at least SAMPLE_S, the libraries in
alternating passes, until the samples agree (``spread``) or a cap; other processes' CPU time during it
is read from /proc/stat (``other_cores``, ``contention``); a loaded or noisy table (``judge``) is
used for its run only and measured again by the next, as is a clean one older than MAX_AGE_DAYS
or of another CACHE_VERSION (``stale``). A close call, or one within the noise, goes to torch
(``decide``). ``dfmp2 bench --blas`` re-measures (``remeasure``); ``describe`` says what was chosen
and on what evidence. A cache that cannot be read or written only costs a probe (and a warning).

Ops and classes (``CLASSES``): 'gemm' and 'syrk' run on torch's thread count; 'pair' is the
gemm+torch pair step's K_i = B_i B_J^T (nvir, naux) @ (naux, j*nvir), one GEMM per row i on ONE
thread (the rows are shared among threads, torch_ops.mp2_pair_energy), so it is probed on one
thread; the default pair step's tiles (linalg.cpu_pair) run one at a time on all threads and are
chosen as a 'gemm' of their size. The
size class of a call is from its GEMM-equivalent flop count 2*m*n*k: small < SMALL_FLOPS <=
medium < LARGE_FLOPS <= large.

Zero copy: tensors become numpy arrays with ``t.numpy()`` (shared memory) and ``np.matmul`` writes
into a torch-allocated output (``out=``); numpy calls its BLAS's GEMM directly for operands with a
unit stride in either dimension (a transposed view is passed as BLAS's 'T'), and its SYRK for
``x @ x.T`` of one buffer. Other layouts (and 1-D, batched, integer or beta != 0 calls) go to
torch, and the record says so: ``Backend.kernels_used`` names what ran each call.

Threads: the OpenBLAS pools get torch's thread count (threadpoolctl), set before every call whose
count differs, so the two libraries never run more threads than torch alone; the pair step runs
its OpenBLAS GEMMs on one thread per row as it does torch's (``single_thread``).

Nothing is read from the environment at import time; the per-process memo of the table
(``_TABLES``) is a measurement of this machine, not backend state.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import json
import math
import os
import re
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

MODES = ("auto", "torch", "openblas")
OPS = ("gemm", "syrk", "pair")
DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32"}
CLASSES = ("small", "medium", "large")
SMALL_FLOPS = 1e7  # 2*m*n*k below this: small
LARGE_FLOPS = 2e8  # at or above this: large
MARGIN = 0.10  # OpenBLAS is chosen only when at least 10% faster (plus the timings' noise, decide): a
# second thread pool has costs the probe does not see (its idle threads spin between calls next to
# torch's OpenMP threads), and a close call must not flip between probes
AFTER_ELEMS = 1 << 19  # each probe call is followed by a threaded torch op on 4 MB (_probe_calls)
SAMPLE_S = 0.02  # a timed sample lasts at least this long (calls of a small shape batched): single
# calls of a few ms, as the probe of CACHE_VERSION 3 timed, varied so much between quiet probes
# that the choice of several classes flipped
MIN_SAMPLES = 2  # samples per library and case in the first passes, before the spread is judged ...
MAX_SAMPLES = 5  # ... and at most this many (one more per further pass; a noisy machine: judge)
SPREAD_OK = 0.05  # 2nd-best / best sample - 1 (spread) at most this: the best time is confirmed
LOADED_CORES = 0.25  # other processes' (and steal) cores taken from the probe's threads (contention)
# over the whole probe above this: loaded
ENTRY_LOADED_CORES = 0.5  # ... or above this during one entry (a shorter window, coarser readings)
BUDGET_S = 12.0  # no further pass starts after this many seconds of probing
MAX_AGE_DAYS = 30  # a clean table older than this is measured again (libraries, firmware, neighbours)
BUSY_CHECK_S = 0.3  # a run due to measure again first reads other processes' CPU this long (busy_now)
LOCK_WAIT_S = 60.0  # a probe waits at most this long for another process's probe (_probe_lock)
STATUSES = ("clean", "noisy", "loaded")
LIBS = ("torch", "openblas")  # the probe's order in each pass
SETTLE_S = 0.15  # pause before a torch pass that follows an OpenBLAS one: OpenBLAS's idle workers
# spin about 0.1 s after a call (its THREAD_TIMEOUT, 2^28 cycles) and halve a torch GEMM meanwhile
CACHE_VERSION = 4  # 4: samples of SAMPLE_S, spreads, other processes' CPU and a status per table;
# only a clean, current table is reused (3: 'pair' is gemm+torch's rows only, the tiles a 'gemm')
# The cases of each (op, class), laid out as the run lays them out, each inside its class. gemm
# (m, n, k, layout) for (m, k) @ (k, n): 'tt' the SCF's K build Z = C^T B_P^T (both operands
# transposed views: m = nocc, k = nao, n = nao * aux block), 'tn' a pair-step tile (two slices of
# Bt (naux, nocc*nvir), the first transposed: m, n = tile sides, k = naux), 'nn' contiguous; syrk
# (n, k) for a^T a with a (k, n), the K build's Z^T Z; pair (m, n, k, 'tn'): gemm+torch's row
# K_i = (nvir, naux) @ (naux, j*nvir) on one thread. A class with two cases is timed by their sum.
PROBE_SHAPES = {
    "gemm": {
        "small": ((64, 256, 256, "nn"),),
        "medium": ((40, 8192, 192, "tt"), (192, 192, 1024, "tn")),
        "large": ((80, 20736, 384, "tt"), (912, 912, 1344, "tn")),
    },
    "syrk": {"small": ((96, 512),), "medium": ((192, 2048),), "large": ((384, 4096),)},
    "pair": {"small": ((24, 384, 96, "tn"),), "medium": ((96, 768, 384, "tn"),), "large": ((152, 1216, 1344, "tn"),)},
}
_TABLES: dict = {}  # cache key -> table (this process's memo of the probe or the cache file)
_LOCK = threading.Lock()


def size_class(flops: float) -> str:
    """'small' | 'medium' | 'large' for a GEMM-equivalent flop count 2*m*n*k."""
    return "small" if flops < SMALL_FLOPS else ("medium" if flops < LARGE_FLOPS else "large")


def entry(op: str, dtype: torch.dtype, cls: str) -> str:
    """The table's key of an op, dtype and class: 'gemm/fp64/large'."""
    return f"{op}/{DTYPE_NAMES[dtype]}/{cls}"


# ---- the libraries ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _openblas_controllers() -> list:
    """threadpoolctl's controllers of the loaded OpenBLAS libraries (numpy's and scipy's)."""
    return [c for c in _controller().lib_controllers if c.internal_api == "openblas"]


def numpy_blas_info() -> dict | None:
    """threadpoolctl's record of the BLAS np.matmul calls (numpy's own library), or None when numpy
    has no OpenBLAS here. Keys: library, version, architecture (core type), threads,
    threading_layer, filepath."""
    libs = _openblas_controllers()
    mine = [c for c in libs if "numpy" in c.filepath] or libs
    if not mine:
        return None
    info = mine[0].info()
    return {
        "library": "OpenBLAS",
        "version": info.get("version"),
        "architecture": info.get("architecture"),
        "threads": info.get("num_threads"),
        "threading_layer": info.get("threading_layer"),
        "filepath": info.get("filepath"),
    }


@functools.lru_cache(maxsize=1)
def torch_blas_info() -> dict:
    """torch's BLAS: library ('MKL' or BLAS_INFO of torch's build), its version, torch's version."""
    config = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version (\S+)", config)
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    library = "MKL" if torch.backends.mkl.is_available() else (blas.group(1) if blas else "unknown")
    return {"library": library, "version": mkl.group(1) if mkl else None, "torch": torch.__version__}


def _set_openblas_threads(n: int) -> None:
    for c in _openblas_controllers():
        c.set_num_threads(n)


class _Threads:
    """Keeps the OpenBLAS pools at torch's thread count (one ctypes call when it changes)."""

    def __init__(self):
        self.current = None

    def sync(self, n: int | None = None) -> None:
        n = torch.get_num_threads() if n is None else n
        if n != self.current:
            _set_openblas_threads(n)
            self.current = n


_THREADS = _Threads()


def sync_threads() -> None:
    """The OpenBLAS pools at torch's thread count now (for a caller that runs openblas_matmul itself)."""
    _THREADS.sync()


@contextlib.contextmanager
def single_thread():
    """OpenBLAS on one thread inside (the pair step's rows each run one GEMM at a time), then back
    to torch's thread count as it was on entry."""
    n = torch.get_num_threads()
    _THREADS.sync(1)
    try:
        yield
    finally:
        _THREADS.sync(n)


# ---- the OpenBLAS calls ----------------------------------------------------------------------
def blasable(x: np.ndarray) -> bool:
    """Whether np.matmul passes this 2-D operand to BLAS as it is (no copy): a unit stride in one
    dimension and a leading dimension no shorter than the other (numpy's own test)."""
    if x.ndim != 2 or min(x.shape) < 2:
        return False
    sz = x.itemsize
    s0, s1 = x.strides
    return (s1 == sz and s0 % sz == 0 and s0 // sz >= x.shape[1]) or (
        s0 == sz and s1 % sz == 0 and s1 // sz >= x.shape[0]
    )


def openblas_ok(*tensors: torch.Tensor) -> bool:
    """The operands (op(a), op(b) views) can go to OpenBLAS without a copy: 2-D CPU fp64/fp32 tensors
    of one dtype, blasable, not needing grad."""
    t0 = tensors[0]
    return all(
        t.device.type == "cpu"
        and t.dtype == t0.dtype
        and t.dtype in DTYPE_NAMES
        and t.ndim == 2
        and not t.requires_grad
        and blasable(t.detach().numpy())
        for t in tensors
    )


def openblas_matmul(A: torch.Tensor, B: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A (m, k) @ B (k, n) -> (m, n) through numpy's OpenBLAS, into ``out`` (contiguous, (m, n)) or a
    new torch tensor; A and B are shared with numpy, never copied (see ``blasable``). When A and B
    are transposed views of one buffer numpy calls SYRK and mirrors it (an exactly symmetric C)."""
    if out is None:
        out = torch.empty((A.shape[0], B.shape[1]), dtype=A.dtype)
    np.matmul(A.numpy(), B.numpy(), out=out.numpy())
    return out


# ---- the probe and its cache -----------------------------------------------------------------
def cache_path() -> Path:
    """$XDG_CACHE_HOME/dfmp2/cpu_blas.json, or ~/.cache/dfmp2/cpu_blas.json."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "dfmp2" / "cpu_blas.json"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else platform.processor(), else 'unknown'."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown"


def cache_key(threads: int) -> str:
    """What a measurement depends on: CPU model and count, threads, torch, numpy and OpenBLAS."""
    ob = numpy_blas_info() or {}
    return (
        f"{cpu_model()}|cpus={os.cpu_count()}|threads={threads}|torch={torch.__version__}"
        f"|{torch_blas_info()['library']}={torch_blas_info()['version']}|numpy={np.__version__}"
        f"|openblas={ob.get('version')}/{ob.get('architecture')}"
    )


# ---- the load on the machine -----------------------------------------------------------------
def cpu_mark() -> dict | None:
    """A reading for ``other_cores`` and ``contention``: the busy time of all CPUs (/proc/stat:
    user, nice, system, irq, softirq), their steal time, this process's own CPU time (os.times),
    each of its threads' run-queue wait (``_task_waits``), in seconds, with the wall clock; None
    where /proc/stat does not exist. The /proc/stat rule is dfmp2.benchmarks.timing's OtherCPU
    (which linalg cannot import): the load average cannot tell the probe's own threads from other
    processes'."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (v + [0] * 8)[:8]
    hz = os.sysconf("SC_CLK_TCK")
    t = os.times()
    return {
        "wall": time.perf_counter(),
        "busy": (user + nice + system + irq + softirq) / hz,
        "steal": steal / hz,
        "own": t.user + t.system + t.children_user + t.children_system,
        "waits": _task_waits(),
    }


def _task_waits() -> dict | None:
    """{thread id: seconds it spent runnable but waiting for a CPU} of this process's threads
    (/proc/self/task/*/schedstat, second field, ns); None where the kernel does not keep it."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[tid] = int(f.read().split()[1]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out or None


def other_cores(a: dict | None, b: dict | None) -> float | None:
    """Cores other processes used between readings ``a`` and ``b`` (b later): their CPU time plus
    a VM's steal time, per second of wall time; None without two readings."""
    if a is None or b is None or b["wall"] <= a["wall"]:
        return None
    taken = (b["busy"] - a["busy"]) - (b["own"] - a["own"]) + (b["steal"] - a["steal"])
    return round(max(taken, 0.0) / (b["wall"] - a["wall"]), 3)


def beyond_idle(other: float | None, threads: int) -> float | None:
    """Of ``other`` cores used by other processes, those beyond the cores a probe of ``threads``
    threads leaves idle (os.cpu_count() - threads): the one-thread 'pair' entries leave a core of
    a 2-core machine to the others."""
    if other is None:
        return None
    return round(max(0.0, other - ((os.cpu_count() or 1) - threads)), 3)


def contention(a: dict | None, b: dict | None, threads: int) -> float | None:
    """Cores other processes took from a probe of ``threads`` threads between readings ``a`` and
    ``b``: the smaller of (1) its threads' run-queue wait plus steal, per second (a thread that
    waited for a CPU was slowed; but OpenBLAS's threads spinning after a call make torch's wait
    too, with nobody else on the machine) and (2) other processes' cores beyond the idle ones
    (``beyond_idle``; but idle-priority jobs that only fill the probe's pauses count there too).
    Real load shows in both. Only (2) where the kernel keeps no run-queue wait; None without
    /proc/stat."""
    other = beyond_idle(other_cores(a, b), threads)
    if other is None or a["waits"] is None or b["waits"] is None:
        return other
    waited = sum(w - a["waits"].get(tid, 0.0) for tid, w in b["waits"].items())
    waited = (max(waited, 0.0) + b["steal"] - a["steal"]) / (b["wall"] - a["wall"])
    return round(min(other, waited), 3)


def _loadavg() -> list | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None


# ---- the probe ---------------------------------------------------------------------------------
def _probe_calls(op: str, case: tuple, dtype: torch.dtype) -> tuple[float, dict]:
    """(GEMM-equivalent flops, {library: one call}) of one probe case, its operands laid out as the
    run's are (``PROBE_SHAPES``). Each call is followed by a threaded torch op on 4 MB
    (AFTER_ELEMS): in a run torch's elementwise work follows every GEMM, and OpenBLAS's idle
    threads (spinning after a call) slow it down; the probe charges that to the library that caused
    it. Torch's SYRK is torch_ops.syrk, as run."""
    from . import torch_ops

    def rand(*shape):  # a GEMM's time does not depend on finite values; filling is ~20x faster than rand
        return torch.full(shape, 0.5, dtype=dtype)

    if op == "syrk":
        n, k = case
        a = rand(k, n)
        out = torch.empty((n, n), dtype=dtype)
        flops, calls = 2.0 * n * n * k, {"torch": lambda: torch_ops.syrk(a, trans=True)}
        calls["openblas"] = lambda: openblas_matmul(a.mT, a, out)
    else:
        m, n, k, layout = case
        if layout == "tt":  # the K build's Z = C^T B_P^T: both operands transposed views
            A, B = rand(k, m).mT, rand(n, k).mT
        elif layout == "tn":  # a pair GEMM: two slices of Bt (naux, nocc*nvir), the first transposed
            Bt = rand(k, m + n)
            A, B = Bt[:, :m].mT, Bt[:, m:]
        else:
            A, B = rand(m, k), rand(k, n)
        out = torch.empty((m, n), dtype=dtype)
        flops, calls = 2.0 * m * n * k, {"torch": lambda: torch.matmul(A, B, out=out)}
        calls["openblas"] = lambda: openblas_matmul(A, B, out)
    after = torch.zeros(AFTER_ELEMS, dtype=torch.float64)

    def then_torch(fn):
        def run():
            fn()
            after.mul_(1.0)

        return run

    return flops, {lib: then_torch(fn) for lib, fn in calls.items()}


def _sample(fn, calls: int) -> float:
    """Seconds per call of ``calls`` calls of ``fn`` timed together (one sample)."""
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls


def _calibrate(fn, sample_s: float) -> float:
    """Seconds per call of ``fn`` from 1, 2, 4, ... calls timed together until they take at least
    half of ``sample_s`` (one call preempted by another process cannot make a sample of a 0.1 ms
    call one call long)."""
    calls = 1
    while True:
        t = _sample(fn, calls)
        if t * calls >= 0.5 * sample_s or calls >= 1 << 16:
            return t
        calls *= 2


def spread(samples: list) -> float:
    """2nd-best / best - 1 of a list of seconds (0.0 for fewer than two): how far the best sample
    is from being confirmed by another."""
    s = sorted(samples)
    return s[1] / s[0] - 1.0 if len(s) > 1 and s[0] > 0 else 0.0


def _block(e: dict, lib: str, samples: int, sample_s: float) -> None:
    """``samples`` samples of library ``lib`` on each case of probe entry ``e`` (``probe``), on
    e's thread count (the caller restores torch's): the operands built afresh, one warm-up call
    per case, the calls per sample set on the library's first block (a sample lasts at least
    ``sample_s``: one call when the warm-up took that long, else ``_calibrate``); the samples go
    to e['times'], the block's wall time, other processes' cores and contention (weighted by
    that time) to e's sums."""
    torch.set_num_threads(e["threads"])
    _THREADS.sync(e["threads"])
    fns = [_probe_calls(e["op"], case, e["dtype"])[1][lib] for case in e["cases"]]
    warm = [_sample(fn, 1) for fn in fns]  # the first call: thread pools wake, pages are touched
    if lib not in e["calls"]:  # a call as long as a sample needs no calibration
        e["calls"][lib] = [
            1 if w >= sample_s else max(1, math.ceil(sample_s / max(_calibrate(fn, sample_s), 1e-9)))
            for fn, w in zip(fns, warm)
        ]
    m0 = cpu_mark()
    for _ in range(samples):
        for fn, calls, times in zip(fns, e["calls"][lib], e["times"][lib]):
            times.append(_sample(fn, calls))
    m1 = cpu_mark()
    if m0 is not None and m1 is not None:
        wall = m1["wall"] - m0["wall"]
        e["wall"] += wall
        e["other"] += (other_cores(m0, m1) or 0.0) * wall
        e["contention"] += (contention(m0, m1, e["threads"]) or 0.0) * wall


def _worst_spread(e: dict) -> float:
    return max(spread(t) for lib in LIBS for t in e["times"][lib])


def _record(e: dict) -> dict:
    """The cache's record of a probe entry: shapes, threads, seconds {library: sum over cases of
    the best sample}, gflops, spread {library: the worst case's}, case_seconds [{library: best}],
    samples (per library and case), calls {library: per case}, other_cores and contention (mean
    over its timed blocks), wall_s (of those blocks)."""
    flops = sum(2.0 * c[0] * c[0] * c[1] if e["op"] == "syrk" else 2.0 * c[0] * c[1] * c[2] for c in e["cases"])
    seconds = {lib: sum(min(t) for t in e["times"][lib]) for lib in LIBS}
    wall = e["wall"]
    return {
        "shapes": [list(c) for c in e["cases"]],
        "threads": e["threads"],
        "seconds": {lib: float(f"{t:.6g}") for lib, t in seconds.items()},
        "gflops": {lib: round(flops / t / 1e9, 2) for lib, t in seconds.items()},
        "spread": {lib: round(max(spread(t) for t in e["times"][lib]), 4) for lib in LIBS},
        "case_seconds": [
            {lib: float(f"{min(e['times'][lib][i]):.6g}") for lib in LIBS} for i in range(len(e["cases"]))
        ],
        "samples": min(len(t) for lib in LIBS for t in e["times"][lib]),
        "calls": dict(e["calls"]),
        "other_cores": round(e["other"] / wall, 3) if wall else None,
        "contention": round(e["contention"] / wall, 3) if wall else None,
        "wall_s": round(wall, 3) if wall else None,
    }


def decide(seconds: dict, spreads: dict, margin: float = MARGIN) -> str:
    """'openblas' when it took less than (1 - margin - both libraries' spreads) of torch's time,
    else 'torch': a close call, or one within the timings' noise, goes to torch every time, so
    two probes of one machine agree wherever the libraries differ by more than margin + noise."""
    need = 1.0 - margin - spreads.get("torch", 0.0) - spreads.get("openblas", 0.0)
    return "openblas" if seconds["openblas"] < need * seconds["torch"] else "torch"


def undecided(record: dict) -> bool:
    """An entry whose samples spread over SPREAD_OK and whose choice that spread decides: OpenBLAS
    looks faster by more than MARGIN but not by MARGIN plus the spreads (``decide`` with and
    without them differ). Noise elsewhere cannot change the choice, so it does not call for a
    new probe (a machine whose small calls always spread would otherwise probe on every run)."""
    if max(record["spread"].values()) <= SPREAD_OK:
        return False
    return decide(record["seconds"], record["spread"]) != decide(record["seconds"], {})


def judge(measured: dict, shared: float | None) -> tuple[str, str | None]:
    """(status, why) of a probe: 'loaded' when other processes took more than LOADED_CORES of the
    probe's cores (``contention``) over the whole probe (``shared``: the entries' mean, weighted by
    their time) or more than ENTRY_LOADED_CORES during one entry, 'noisy' when an entry is
    ``undecided``, else 'clean' (why None). Only a clean table is trusted by later runs."""
    busy = {e: r["contention"] for e, r in measured.items() if (r.get("contention") or 0.0) > ENTRY_LOADED_CORES}
    if (shared or 0.0) > LOADED_CORES or busy:
        worst = max(busy, key=busy.get) if busy else None
        return "loaded", (
            f"other processes took {shared or 0.0:.2f} of the probe's cores (limit {LOADED_CORES})"
            + (f", {busy[worst]:.2f} during {worst}" if worst else "")
        )
    noisy = {e: max(r["spread"].values()) for e, r in measured.items() if undecided(r)}
    if noisy:
        worst = max(noisy, key=noisy.get)
        return "noisy", (
            f"{len(noisy)} of {len(measured)} entries' timings spread over {SPREAD_OK:.0%} where the spread "
            f"decides the choice (the worst, {worst}: {noisy[worst]:.0%})"
        )
    return "clean", None


def probe(
    sample_s: float | None = None,
    min_samples: int | None = None,
    max_samples: int | None = None,
    budget_s: float | None = None,
) -> dict:
    """Measure every (op, dtype, class) of PROBE_SHAPES with both libraries ('pair' on one thread,
    the others on torch's thread count) in passes over all entries, one library at a time
    (``_block``): torch, then OpenBLAS, ``min_samples`` samples each; then, for the entries whose
    spread (``spread``) is over SPREAD_OK, further passes of one sample per library until it is
    not, or ``max_samples``, or ``budget_s`` seconds. Not call by call: OpenBLAS's idle worker
    threads spin for ~0.1 s after a call and halve a torch GEMM that starts meanwhile, which made
    torch look slow (and noisy) in an interleaved probe; a torch pass after an OpenBLAS one waits
    SETTLE_S first. Other processes' CPU use is read during every block (``other_cores``,
    ``contention``) and the table judged (``judge``); once an entry was loaded no pass is added
    (method.min_samples_after: the table will serve its run alone). Smaller ``sample_s`` /
    ``max_samples`` make a cheaper, noisier probe (tests); each argument left None is its module
    constant at the call. Returns the table the cache keeps: choice {entry: library}, gflops,
    measured {entry: ``_record``}, load {other_cores, contention, method, loadavg_before/after},
    status, why, method (the probe's rule and constants), probe_version, date, seconds (the probe's
    wall time), threads."""
    t0 = time.perf_counter()
    sample_s = SAMPLE_S if sample_s is None else sample_s
    min_samples = MIN_SAMPLES if min_samples is None else min_samples
    max_samples = MAX_SAMPLES if max_samples is None else max_samples
    deadline = t0 + (BUDGET_S if budget_s is None else budget_s)
    nthreads = torch.get_num_threads()
    load_before, start = _loadavg(), cpu_mark()
    entries = [
        {"name": entry(op, dt, cls), "op": op, "dtype": dt, "cases": cases, "threads": 1 if op == "pair" else nthreads}
        | {
            "calls": {},
            "times": {lib: [[] for _ in cases] for lib in LIBS},
            "wall": 0.0,
            "other": 0.0,
            "contention": 0.0,
        }
        for op in OPS
        for dt in DTYPE_NAMES
        for cls, cases in PROBE_SHAPES[op].items()
    ]
    todo, taken, hurried = entries, 0, None
    try:
        while todo:
            n = min_samples if taken == 0 else 1
            for lib in LIBS:
                if lib == "torch" and taken:
                    time.sleep(SETTLE_S)  # OpenBLAS's workers stop spinning
                for e in todo:
                    try:
                        _block(e, lib, n, sample_s)
                    finally:
                        torch.set_num_threads(nthreads)
                        _THREADS.sync(nthreads)
                    if hurried is None and e["wall"] and e["contention"] / e["wall"] > ENTRY_LOADED_CORES:
                        hurried = e["name"]
            taken += n
            more = not hurried and taken < max_samples and time.perf_counter() < deadline
            todo = [e for e in todo if _worst_spread(e) > SPREAD_OK] if more else []
    finally:
        _THREADS.sync(nthreads)
    measured = {e["name"]: _record(e) for e in entries}
    wall = sum(e["wall"] for e in entries)
    shared = round(sum(e["contention"] for e in entries) / wall, 3) if wall else None
    status, why = judge(measured, shared)
    return {
        "choice": {e: decide(r["seconds"], r["spread"]) for e, r in measured.items()},
        "gflops": {e: r["gflops"] for e, r in measured.items()},
        "measured": measured,
        "load": {
            "other_cores": other_cores(start, cpu_mark()),
            "contention": shared,
            "method": _load_method(start),
            "loadavg_before": load_before,
            "loadavg_after": _loadavg(),
        },
        "status": status,
        "why": why,
        "method": {
            "rule": "best sample per library; the libraries in alternating passes over all entries (torch, "
            f"OpenBLAS, ...; {SETTLE_S} s pause before a torch pass); openblas only when faster by more than "
            "margin + both spreads",
            "sample_s": sample_s,
            "min_samples": min_samples,
            "max_samples": max_samples,
            "spread_ok": SPREAD_OK,
            "margin": MARGIN,
            "loaded_cores": LOADED_CORES,
            "load_rule": "contention: min(run-queue wait of the probe's threads + steal, other processes' cores "
            "beyond those the probe left idle)",
            "entry_loaded_cores": ENTRY_LOADED_CORES,
            "min_samples_after": hurried,
        },
        "probe_version": CACHE_VERSION,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 3),
        "threads": nthreads,
    }


def _load_method(start: dict | None) -> str:
    if start is None:
        return "none (no /proc/stat): the spread alone"
    if start["waits"]:
        return "/proc/stat minus this process, and its threads' run-queue wait"
    return "/proc/stat minus this process"


# ---- the cache ---------------------------------------------------------------------------------
_TABLE_KEYS = ("choice", "gflops", "measured", "load", "status", "why", "method", "probe_version", "date", "seconds")


def _read_cache(path: Path, key: str) -> tuple[dict | None, str | None]:
    """(this machine's table, None), or (None, why there is none to use): no file, unreadable,
    another cache version, no entry for ``key``, or a damaged entry."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, "no cache file"
    except (OSError, ValueError) as e:
        return None, f"unreadable cache ({type(e).__name__})"
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        return None, f"cache version {version}, this program's {CACHE_VERSION}"
    table = data.get("entries", {}).get(key) if isinstance(data.get("entries"), dict) else None
    if table is None:
        return None, "no table for this machine, threads and libraries in the cache"
    if not valid_table(table):
        return None, "a damaged table in the cache"
    return table, None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _per_library(d) -> bool:
    return isinstance(d, dict) and set(d) == set(LIBS) and all(_number(v) for v in d.values())


def valid_table(table) -> bool:
    """Whether a cached table is whole, every field of the type the program reads (a file written
    by another version, truncated, edited or raced over is used whole or not at all): the choice
    and GF/s of every entry, each entry's measurement, the status and its why, the load, the
    date, the seconds."""
    expected = {entry(op, dt, cls) for op in OPS for dt in DTYPE_NAMES for cls in CLASSES}
    try:
        measured = table["measured"]
        ok = (
            isinstance(table, dict)
            and all(k in table for k in _TABLE_KEYS)
            and isinstance(table["choice"], dict)
            and set(table["choice"]) == expected
            and set(table["choice"].values()) <= set(MODES[1:])
            and isinstance(table["gflops"], dict)
            and set(table["gflops"]) == expected
            and all(_per_library(g) for g in table["gflops"].values())
            and isinstance(measured, dict)
            and set(measured) == expected
            and all(
                isinstance(r, dict)
                and _per_library(r["gflops"])
                and _per_library(r["spread"])
                and _per_library(r["seconds"])
                and isinstance(r["samples"], int)
                and (r.get("other_cores") is None or _number(r["other_cores"]))
                for r in measured.values()
            )
            and table["status"] in STATUSES
            and (table["why"] is None or isinstance(table["why"], str))
            and isinstance(table["load"], dict)
            and isinstance(table["method"], dict)
            and _number(table["seconds"])
            and isinstance(table["date"], str)
        )
        if ok:
            datetime.datetime.fromisoformat(table["date"])
        return bool(ok)
    except (TypeError, ValueError, AttributeError, KeyError):
        return False


def stale(table: dict, now: datetime.datetime | None = None) -> str | None:
    """Why a cached ``table`` is measured again (None: it is used): not clean (its ``why``), older
    than MAX_AGE_DAYS, or dated in the future (a clock that moved)."""
    if table["status"] != "clean":
        return f"the cached table is {table['status']}: {table['why']}"
    date = datetime.datetime.fromisoformat(table["date"])
    if date.tzinfo is None:
        date = date.replace(tzinfo=datetime.timezone.utc)
    age = ((now or datetime.datetime.now(datetime.timezone.utc)) - date).total_seconds() / 86400.0
    if age > MAX_AGE_DAYS:
        return f"the cached table is {age:.0f} days old (over {MAX_AGE_DAYS})"
    if age < -1.0:
        return "the cached table is dated in the future"
    return None


def _write_cache(path: Path, key: str, table: dict) -> str | None:
    """Add ``table`` under ``key`` (atomic replace); the error's text when it cannot (never raises)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            data = json.loads(path.read_text())
            if data.get("version") != CACHE_VERSION or not isinstance(data.get("entries"), dict):
                raise ValueError
        except (OSError, ValueError, AttributeError):
            data = {"version": CACHE_VERSION, "entries": {}}
        data["entries"][key] = table
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)
        return None
    except (OSError, TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def _probe_lock(path: Path, wait_s: float = LOCK_WAIT_S):
    """One probe at a time per cache file (an flock beside it): ranks or runs that start together
    on one machine would otherwise measure each other's probes as load. After ``wait_s`` seconds,
    or where no lock file can be made, the probe runs without it."""
    try:
        import fcntl

        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path.with_name(f".{path.name}.lock"), "a")
    except (ImportError, OSError):
        yield
        return
    try:
        end = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > end:
                    break
                time.sleep(0.05)
        yield
    finally:
        f.close()  # releases the lock


class Resolved(NamedTuple):
    """The table a CpuBlas uses and where it came from: ``source`` 'user' (forced, no table),
    'cache' or 'probe'; ``cache_error`` when the probe's table could not be written;
    ``remeasured_because`` why this process probed (the cache's state, or a re-measure asked for);
    ``deferred`` why a cached table that is due to be measured again was used as it is (the
    machine was busy when this process looked, ``busy_now``)."""

    table: dict | None
    source: str
    cache_error: str | None = None
    remeasured_because: str | None = None
    deferred: str | None = None


def _probe_and_write(path: Path, key: str, why: str) -> Resolved:
    table = probe()
    return Resolved(table, "probe", _write_cache(path, key, table), why)


def busy_now(threads: int, wait_s: float | None = None) -> float | None:
    """Cores other processes would take from a probe of ``threads`` threads (``beyond_idle``), read
    over ``wait_s`` (BUSY_CHECK_S) seconds of this process sleeping; None without /proc/stat."""
    a = cpu_mark()
    time.sleep(BUSY_CHECK_S if wait_s is None else wait_s)
    return beyond_idle(other_cores(a, cpu_mark()), threads)


def auto_table() -> Resolved:
    """This machine's table: this process's memo, else the cache file when its table is clean and
    current (``stale``), else a new probe (under ``_probe_lock``, after reading the cache again:
    another process may just have measured), written to the cache whatever its status: a loaded
    or noisy one is marked, used for this run and measured again by a later run. Not by one that
    finds the machine busy (``busy_now`` over LOADED_CORES) and a table for this key in the cache:
    that run uses the cached table as it is and says why (``deferred``); measuring again under load
    would cost seconds and give another loaded table."""
    key = cache_key(torch.get_num_threads())
    with _LOCK:
        if key in _TABLES:
            return _TABLES[key]
        path = cache_path()
        table, why = _read_cache(path, key)
        why = why or stale(table)
        if why is None:
            _TABLES[key] = Resolved(table, "cache")
            return _TABLES[key]
        if table is not None:
            busy = busy_now(torch.get_num_threads())
            if busy is not None and busy > LOADED_CORES:
                _TABLES[key] = Resolved(
                    table, "cache", deferred=f"{why}; not measured again now: other processes take {busy:.2f} cores"
                )
                return _TABLES[key]
        with _probe_lock(path):
            again, _ = _read_cache(path, key)
            if again is not None and stale(again) is None:
                _TABLES[key] = Resolved(again, "cache")
            else:
                _TABLES[key] = _probe_and_write(path, key, why)
        return _TABLES[key]


def remeasure(why: str = "asked for") -> Resolved:
    """Probe now whatever the cache holds, write the cache and use the new table in this process
    (``dfmp2 bench --blas``)."""
    key = cache_key(torch.get_num_threads())
    with _LOCK:
        path = cache_path()
        with _probe_lock(path):
            _TABLES[key] = _probe_and_write(path, key, why)
        return _TABLES[key]


class CpuBlasChoiceError(ValueError):
    """A cpu BLAS choice that cannot apply: unknown, 'openblas' without one, or not on the cpu device."""


def check_choice(mode: str, device: str, on_cpu: bool) -> None:
    """CpuBlasChoiceError for a ``mode`` outside MODES, or anything but 'auto' for a ``device``
    that is not the CPU (``on_cpu`` False: it runs its own kernels)."""
    if mode not in MODES:
        raise CpuBlasChoiceError(f"unknown cpu BLAS '{mode}'; use one of {', '.join(MODES)}")
    if mode != "auto" and not on_cpu:
        raise CpuBlasChoiceError(
            f"cpu BLAS '{mode}' applies only to the cpu device, not to '{device}' (it "
            "runs its own kernels); leave it at auto"
        )


class CpuBlas:
    """The choice of BLAS for one CPU backend. ``mode``: 'auto' (the measured table), 'torch' or
    'openblas' (forced by the user). ``library(op, dtype, flops)`` says which runs a call; the
    table is resolved on first use (a backend that never runs a GEMM never probes)."""

    def __init__(self, mode: str = "auto"):
        if mode not in MODES:
            raise CpuBlasChoiceError(f"unknown cpu BLAS '{mode}'; use one of {', '.join(MODES)}")
        if mode == "openblas" and numpy_blas_info() is None:
            raise CpuBlasChoiceError(
                "cpu BLAS 'openblas': numpy here has no OpenBLAS (threadpoolctl finds none); use auto or torch"
            )
        self.mode = mode
        self._table = None

    def table(self) -> Resolved:
        """The table in use (``Resolved``: table None and source 'user' when the user chose)."""
        if self.mode != "auto":
            return Resolved(None, "user")
        if self._table is None:
            self._table = auto_table()
        return self._table

    def library(self, op: str, dtype: torch.dtype, flops: float) -> str:
        """'torch' or 'openblas' for ``op`` (gemm, syrk, pair) in ``dtype`` at ``flops`` (2*m*n*k)."""
        if self.mode != "auto":
            return self.mode
        if dtype not in DTYPE_NAMES:
            return "torch"
        return self.table().table["choice"][entry(op, dtype, size_class(flops))]

    def matmul(self, A: torch.Tensor, B: torch.Tensor, op: str = "gemm", out=None) -> tuple[torch.Tensor, str] | None:
        """A (m, k) @ B (k, n) through OpenBLAS when the choice for ``op`` at this shape says so and
        the operands allow it without a copy: (C, kernel name); None means 'torch runs it'."""
        if A.ndim != 2 or B.ndim != 2 or A.shape[1] != B.shape[0]:  # torch_ops says what is wrong
            return None
        flops = 2.0 * A.shape[0] * A.shape[1] * B.shape[1]
        if self.library(op, A.dtype, flops) != "openblas" or not openblas_ok(A, B):
            return None
        if out is not None and not (
            out.is_contiguous() and out.dtype == A.dtype and openblas_ok(out) and out.shape == (A.shape[0], B.shape[1])
        ):
            return None
        if op != "pair":
            _THREADS.sync()
        syrk = A.data_ptr() == B.data_ptr() and A.stride() == B.stride()[::-1] and A.shape == B.shape[::-1]
        prefix = "d" if A.dtype == torch.float64 else "s"
        return openblas_matmul(A, B, out), f"openblas.{prefix}{'syrk' if syrk else 'gemm'}(numpy.matmul)"

    def pair(self, Bi: torch.Tensor, Bj: torch.Tensor, rows: int, cols: int, layout: str) -> dict | None:
        """How OpenBLAS runs the pair step's GEMMs, each (rows, naux) @ (naux, cols): ``layout``
        'tiles' (linalg.cpu_pair: one tile at a time on the BLAS's threads, chosen as a 'gemm' of
        that size) or 'rows' (torch_ops.mp2_pair_energy: each row's GEMM on one thread, chosen as a
        'pair'). {'matmul', 'kernel'} (and 'serial' for rows), or None when torch runs them (the
        choice, or operands OpenBLAS would need copied)."""
        if Bi.ndim != 3 or Bi.shape[0] == 0 or Bj.shape[0] == 0:
            return None
        naux = Bi.shape[2]
        op = "gemm" if layout == "tiles" else "pair"
        if self.library(op, Bi.dtype, 2.0 * rows * naux * cols) != "openblas":
            return None
        if layout == "tiles":
            from .cpu_pair import tile_operands

            A, B = tile_operands(Bi, Bj)
        else:
            A, B = Bi[0], Bj.permute(2, 0, 1).reshape(naux, -1)
            if B.data_ptr() != Bj.data_ptr():
                return None
        if not openblas_ok(A, B):
            return None
        _THREADS.sync()
        kernel = f"openblas.{'d' if Bi.dtype == torch.float64 else 's'}gemm(numpy.matmul, {layout})"
        if layout == "tiles":
            return {"matmul": openblas_matmul, "kernel": kernel}
        return {"matmul": openblas_matmul, "serial": single_thread, "kernel": kernel}

    def fp32_speedup(self) -> float | None:
        """Large SGEMM GF/s over large DGEMM GF/s in this machine's probe table, each of the library
        that runs it (the forced one, or the table's choice): what decides a mixed-precision SCF
        (dfmp2.scf.precision.resolve_precision). A forced library reads the table too (probed once
        per machine if no cache has it). None when the table has no such entries."""
        table = self.table()[0] if self.mode == "auto" else auto_table()[0]
        try:
            rates = []
            for dt in (torch.float32, torch.float64):
                key = entry("gemm", dt, "large")
                lib = self.mode if self.mode != "auto" else table["choice"][key]
                rates.append(float(table["gflops"][key][lib]))
        except (KeyError, TypeError, ValueError):
            return None
        return rates[0] / rates[1] if rates[1] > 0 else None

    def describe(self) -> dict:
        """What the choice is and why: mode, source ('user' | 'cache' | 'probe'), remeasured_because
        (why this process probed), deferred (why a table due to be measured again was not), choice
        {entry: library}, the probe's GF/s {entry: {library: GF/s}}, status ('clean' | 'noisy' |
        'loaded', None when the user chose) and its why, probe seconds, date and version, probe
        (per entry: shapes, seconds, spreads, samples, other processes' cores; the load over the
        whole probe; the method), warning (a table not to be trusted, used for this run), the cache
        file and any problem writing it, and both libraries (torch's BLAS and version; OpenBLAS's
        version, core type and threads)."""
        r = self.table()
        t = r.table
        ob = numpy_blas_info()
        if ob is not None:
            ob = dict(ob, threads=_THREADS.current or ob["threads"])
        return {
            "mode": self.mode,
            "source": r.source,
            "remeasured_because": r.remeasured_because,
            "deferred": r.deferred,
            "choice": dict(t["choice"]) if t else None,
            "probe_gflops": dict(t["gflops"]) if t else None,
            "status": t["status"] if t else None,
            "status_why": t["why"] if t else None,
            "probe_seconds": t["seconds"] if t else None,
            "probe_date": t["date"] if t else None,
            "probe_version": t["probe_version"] if t else None,
            "probe": {"measured": t["measured"], "load": t["load"], "method": t["method"]} if t else None,
            "warning": self.warning(),
            "cache": str(cache_path()) if self.mode == "auto" else None,
            "cache_error": r.cache_error,
            "libraries": {"torch": dict(torch_blas_info(), threads=torch.get_num_threads()), "openblas": ob},
        }

    def warning(self) -> str | None:
        """One line when the table in use is not to be trusted (loaded or noisy: used for this run,
        measured again by the next) or could not be cached; None otherwise."""
        r = self.table()
        if r.table is None:
            return None
        if r.table["status"] != "clean":
            return (
                f"the cpu BLAS choice of this run was measured on a {r.table['status']} machine "
                f"({r.table['why']})"
                + (f", {r.table['date'][:10]}, and not again now (other processes busy)" if r.deferred else "")
                + "; it is not cached as trusted: the next run on a quiet machine measures again "
                "(dfmp2 bench --blas re-measures; --cpu-blas torch or openblas forces one)"
            )
        if r.cache_error:
            return f"the cpu BLAS choice could not be cached ({r.cache_error}): the next run measures again"
        return None
