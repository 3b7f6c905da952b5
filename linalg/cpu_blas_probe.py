"""The measurement behind linalg.cpu_blas's choice: each (op, dtype, size class) timed with torch's
BLAS and with numpy's OpenBLAS (``probe``), the load other processes put on the machine meanwhile
(``cpu_mark``, ``other_cores``, ``contention``), and the verdict on the measurement (``judge``).

The probe must not be fooled: single calls of a few ms varied so much that quiet probes
disagreed, and a probe taken while other processes ran was cached for good. So each class is
timed on the run's own layouts in samples of at least SAMPLE_S, the libraries in alternating
passes, until the samples agree (``spread``) or a cap; other processes' CPU time during it is read
from /proc/stat (``other_cores``, ``contention``); a loaded or noisy table (``judge``) is used for
its run only and measured again by the next. A close call, or one within the noise, goes to torch
(``decide``).

Ops and classes (``CLASSES``): 'gemm' and 'syrk' run on torch's thread count; 'pair' is the
gemm+torch pair step's K_i = B_i B_J^T (nvir, naux) @ (naux, j*nvir), one GEMM per row i on ONE
thread (the rows are shared among threads, torch_ops.mp2_pair_energy), so it is probed on one
thread; the default pair step's tiles (linalg.cpu_pair) run one at a time on all threads and are
chosen as a 'gemm' of their size. The size class of a call is from its GEMM-equivalent flop count
2*m*n*k: small < SMALL_FLOPS <= medium < LARGE_FLOPS <= large.
"""

from __future__ import annotations

import datetime
import math
import os
import time

import torch

from .openblas import _THREADS, openblas_matmul

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
BUSY_CHECK_S = 0.3  # a run due to measure again first reads other processes' CPU this long (busy_now)
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


def size_class(flops: float) -> str:
    """'small' | 'medium' | 'large' for a GEMM-equivalent flop count 2*m*n*k."""
    return "small" if flops < SMALL_FLOPS else ("medium" if flops < LARGE_FLOPS else "large")


def entry(op: str, dtype: torch.dtype, cls: str) -> str:
    """The table's key of an op, dtype and class: 'gemm/fp64/large'."""
    return f"{op}/{DTYPE_NAMES[dtype]}/{cls}"


# ---- the load on the machine -----------------------------------------------------------------
def cpu_times() -> dict | None:
    """The busy time of all CPUs (/proc/stat: user, nice, system, irq, softirq), their steal time
    and this process's own CPU time (os.times: every thread, waited-for children), in seconds, with
    the wall clock; None where /proc/stat does not exist. The load average cannot tell a process's
    own threads from other processes'; the difference of two readings can
    (dfmp2.benchmarks.timing.OtherCPU reads the same)."""
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
    }


def cpu_mark() -> dict | None:
    """A reading for ``other_cores`` and ``contention``: ``cpu_times`` and each of this process's
    threads' run-queue wait (``_task_waits``); None where /proc/stat does not exist."""
    mark = cpu_times()
    if mark is not None:
        mark["waits"] = _task_waits()
    return mark


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
    entries = _probe_entries(nthreads)
    hurried = _probe_passes(entries, nthreads, sample_s, min_samples, max_samples, deadline)
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
        "method": _probe_method(sample_s, min_samples, max_samples, hurried),
        "probe_version": CACHE_VERSION,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": round(time.perf_counter() - t0, 3),
        "threads": nthreads,
    }


def _probe_entries(nthreads: int) -> list[dict]:
    """One probe entry per (op, dtype, class) of PROBE_SHAPES, before any sample: its cases, its
    thread count ('pair' on one thread), and empty sample lists per library."""
    return [
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


def _probe_passes(entries: list, nthreads: int, sample_s: float, min_samples: int, max_samples: int, deadline: float):
    """The probe's passes over ``entries`` (sampled in place), one library at a time, until every
    spread is within SPREAD_OK, ``max_samples``, the ``deadline`` (perf_counter seconds) or a
    loaded entry; returns the first loaded entry's name (no pass added after it) or None. torch's
    and OpenBLAS's thread counts are back at ``nthreads`` however this returns."""
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
    return hurried


def _probe_method(sample_s: float, min_samples: int, max_samples: int, hurried: str | None) -> dict:
    """The probe's rule and constants, as the table records them."""
    return {
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
    }


def _load_method(start: dict | None) -> str:
    if start is None:
        return "none (no /proc/stat): the spread alone"
    if start["waits"]:
        return "/proc/stat minus this process, and its threads' run-queue wait"
    return "/proc/stat minus this process"


def busy_now(threads: int, wait_s: float | None = None) -> float | None:
    """Cores other processes would take from a probe of ``threads`` threads (``beyond_idle``), read
    over ``wait_s`` (BUSY_CHECK_S) seconds of this process sleeping; None without /proc/stat."""
    a = cpu_mark()
    time.sleep(BUSY_CHECK_S if wait_s is None else wait_s)
    return beyond_idle(other_cores(a, cpu_mark()), threads)
