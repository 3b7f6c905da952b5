"""The CPU's BLAS for GEMM, SYRK and the MP2 pair step's GEMM: torch's own (MKL in the x86 wheels)
or the OpenBLAS numpy ships (``np.matmul``), chosen per op, dtype and size class by measurement.

Why: on AMD EPYC numpy's OpenBLAS runs large DGEMM/SGEMM markedly faster than torch's MKL, while
torch wins some smaller shapes; on an Intel CPU MKL may win everywhere. So nothing is decided by
vendor: ``mode='auto'`` runs a short probe (``probe``: one shape per class, both libraries
interleaved, best of ``PROBE_REPEATS``; short) once per machine and caches the
table in ``$XDG_CACHE_HOME/dfmp2/cpu_blas.json`` (or ``~/.cache/dfmp2/``) under a key of CPU
model, thread count and library versions (``cache_key``); a cache that cannot be read or written
only costs a probe. ``mode='torch'`` or ``'openblas'`` forces one library for every op (the
user's choice, recorded as such).

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
import os
import re
import threading
import time
from pathlib import Path

import numpy as np
import torch

MODES = ("auto", "torch", "openblas")
OPS = ("gemm", "syrk", "pair")
DTYPE_NAMES = {torch.float64: "fp64", torch.float32: "fp32"}
CLASSES = ("small", "medium", "large")
SMALL_FLOPS = 1e7  # 2*m*n*k below this: small
LARGE_FLOPS = 2e8  # at or above this: large
PROBE_REPEATS = 2  # timed calls per library and shape, after one warm-up call
MARGIN = 0.10  # OpenBLAS is chosen only when at least 10% faster in the probe: a
# second thread pool has costs the probe does not see (its idle
# threads spin between calls next to torch's OpenMP threads)
AFTER_ELEMS = 1 << 19  # each probe call is followed by a threaded torch op on 4 MB: in a run
# torch's elementwise work follows every GEMM, and OpenBLAS's idle
# threads (spinning after a call) slow it down; the probe charges that
# to the library that caused it
CACHE_VERSION = 3  # 3: 'pair' is gemm+torch's rows only (the tiles are a 'gemm')
# one shape per (op, class) inside that class: gemm (m, n, k); syrk (n, k) as a^T a with a (k, n),
# the SCF's K build; pair (nvir, naux, ncols) for K = (nvir, naux) @ (naux, ncols) on one thread
PROBE_SHAPES = {
    "gemm": {"small": (96, 96, 96), "medium": (320, 320, 320), "large": (512, 512, 512)},
    "syrk": {"small": (64, 256), "medium": (192, 1024), "large": (320, 2048)},
    "pair": {"small": (24, 96, 384), "medium": (96, 384, 768), "large": (128, 640, 1280)},
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


def _probe_case(op: str, shape: tuple, dtype: torch.dtype, repeats: int) -> tuple[float, dict]:
    """(GEMM-equivalent flops, {library: best seconds}) of one probe shape: one warm-up call each,
    then ``repeats`` rounds of one timed call per library, interleaved (load from other jobs, and
    the other library's idle threads, hit both alike). Torch's SYRK is torch_ops.syrk, as run."""
    from . import torch_ops

    g = torch.Generator().manual_seed(0)
    if op == "syrk":
        n, k = shape
        a = torch.rand((k, n), generator=g, dtype=dtype)
        A, B, flops = a.mT, a, 2.0 * n * n * k
        torch_fn = lambda: torch_ops.syrk(a, trans=True)  # noqa: E731
    else:
        m, k, n = (shape[0], shape[2], shape[1]) if op == "gemm" else shape
        A = torch.rand((m, k), generator=g, dtype=dtype)
        B = torch.rand((k, n), generator=g, dtype=dtype)
        flops = 2.0 * m * n * k
        torch_fn = lambda: torch.matmul(A, B, out=out)  # noqa: E731
    out = torch.empty((A.shape[0], B.shape[1]), dtype=dtype)
    after = torch.zeros(AFTER_ELEMS, dtype=torch.float64)

    def then_torch(fn):  # a GEMM, then the kind of torch work that follows it in a run
        def run():
            fn()
            after.mul_(1.0)

        return run

    fns = {"torch": then_torch(torch_fn), "openblas": then_torch(lambda: openblas_matmul(A, B, out))}
    for fn in fns.values():
        fn()
    times = {lib: float("inf") for lib in fns}
    for _ in range(repeats):
        for lib, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[lib] = min(times[lib], time.perf_counter() - t0)
    return flops, times


def probe(repeats: int = PROBE_REPEATS) -> dict:
    """Measure every (op, dtype, class) of PROBE_SHAPES with both libraries (pair on one thread, the
    others on torch's thread count). Returns {'choice': {entry: 'torch'|'openblas'}, 'gflops':
    {entry: {library: GF/s}}, 'seconds': the probe's wall time, 'date', 'threads'}."""
    t0 = time.perf_counter()
    nthreads = torch.get_num_threads()
    choice, gflops = {}, {}
    try:
        for op in OPS:
            for dtype in DTYPE_NAMES:
                for cls, shape in PROBE_SHAPES[op].items():
                    if op == "pair":
                        torch.set_num_threads(1)
                        _THREADS.sync(1)
                    try:
                        flops, times = _probe_case(op, shape, dtype, repeats)
                    finally:
                        torch.set_num_threads(nthreads)
                        _THREADS.sync(nthreads)
                    key = entry(op, dtype, cls)
                    gflops[key] = {lib: round(flops / t / 1e9, 2) for lib, t in times.items()}
                    choice[key] = "openblas" if times["openblas"] < (1.0 - MARGIN) * times["torch"] else "torch"
    finally:
        _THREADS.sync(nthreads)
    return {
        "choice": choice,
        "gflops": gflops,
        "seconds": round(time.perf_counter() - t0, 3),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "threads": nthreads,
    }


def _read_cache(path: Path, key: str) -> dict | None:
    try:
        data = json.loads(path.read_text())
        table = data["entries"][key] if data.get("version") == CACHE_VERSION else None
        expected = {entry(op, dt, cls) for op in OPS for dt in DTYPE_NAMES for cls in CLASSES}
        if table is None or set(table["choice"]) != expected or not set(table["choice"].values()) <= set(MODES[1:]):
            return None
        return table
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
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


def auto_table() -> tuple[dict, str, str | None]:
    """(table, source, cache problem): this machine's table from this process's memo, the cache
    file ('cache') or a new probe ('probe', then written to the cache; a failed write is the third
    item, the run goes on)."""
    key = cache_key(torch.get_num_threads())
    with _LOCK:
        if key in _TABLES:
            return _TABLES[key]
        path = cache_path()
        table = _read_cache(path, key)
        if table is not None:
            _TABLES[key] = (table, "cache", None)
        else:
            table = probe()
            _TABLES[key] = (table, "probe", _write_cache(path, key, table))
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

    def table(self) -> tuple[dict | None, str, str | None]:
        """(measured table or None, source 'user' | 'cache' | 'probe', cache problem or None)."""
        if self.mode != "auto":
            return None, "user", None
        if self._table is None:
            self._table = auto_table()
        return self._table

    def library(self, op: str, dtype: torch.dtype, flops: float) -> str:
        """'torch' or 'openblas' for ``op`` (gemm, syrk, pair) in ``dtype`` at ``flops`` (2*m*n*k)."""
        if self.mode != "auto":
            return self.mode
        if dtype not in DTYPE_NAMES:
            return "torch"
        return self.table()[0]["choice"][entry(op, dtype, size_class(flops))]

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
        """What the choice is and where it came from: mode, source ('user' | 'cache' | 'probe'),
        choice {entry: library} and the probe's GF/s {entry: {library: GF/s}} (None when the user
        chose), probe seconds and date, the cache file and any problem writing it, and both
        libraries (torch's BLAS and version; OpenBLAS's version, core type and threads)."""
        table, source, problem = self.table()
        ob = numpy_blas_info()
        if ob is not None:
            ob = dict(ob, threads=_THREADS.current or ob["threads"])
        return {
            "mode": self.mode,
            "source": source,
            "choice": dict(table["choice"]) if table else None,
            "probe_gflops": dict(table["gflops"]) if table else None,
            "probe_seconds": table["seconds"] if table else None,
            "probe_date": table["date"] if table else None,
            "cache": str(cache_path()) if self.mode == "auto" else None,
            "cache_error": problem,
            "libraries": {"torch": dict(torch_blas_info(), threads=torch.get_num_threads()), "openblas": ob},
        }
