"""The CPU's BLAS for GEMM, SYRK and the MP2 pair step's GEMM: torch's own (MKL in the x86 wheels)
or the OpenBLAS numpy ships (``np.matmul``), chosen per op, dtype and size class by measurement.

Why: on AMD EPYC numpy's OpenBLAS runs large DGEMM/SGEMM markedly faster than torch's MKL, while
torch wins some smaller shapes; on an Intel CPU MKL may win everywhere. So nothing is decided by
vendor: ``mode='auto'`` measures (``probe``) and caches the table in
``$XDG_CACHE_HOME/dfmp2/cpu_blas.json`` (or ``~/.cache/dfmp2/``) under a key of CPU model, thread
count and library versions (``cache_key``). ``mode='torch'`` or ``'openblas'`` forces one library
for every op (the user's choice, recorded as such).

The table comes from linalg.cpu_blas_probe (``probe``: how each entry is timed and a loaded or
noisy measurement told from a clean one) and the libraries' calls from linalg.openblas (zero-copy
operands, thread pools). This module decides which table to use: a loaded or noisy table is used
for its run only and measured again by the next, as is a clean one older than MAX_AGE_DAYS or of
another CACHE_VERSION (``stale``); ``dfmp2 bench --blas`` re-measures (``remeasure``);
``describe`` says what was chosen and on what evidence. A cache that cannot be read or written
only costs a probe (and a notice: ``take_notices``, one line the CLI prints on stderr unless -q).
An op whose operands OpenBLAS cannot take as they are goes to torch, and the record says so:
``Backend.kernels_used`` names what ran each call.

Nothing is read from the environment at import time; the per-process memo of the table
(``_TABLES``) is a measurement of this machine, not backend state.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .cpu_blas_probe import (
    CACHE_VERSION,
    CLASSES,
    DTYPE_NAMES,
    LIBS,
    LOADED_CORES,
    OPS,
    busy_now,
    entry,
    probe,
    size_class,
)
from .openblas import _THREADS, numpy_blas_info, openblas_matmul, openblas_ok, single_thread, torch_blas_info

MODES = ("auto", "torch", "openblas")
MAX_AGE_DAYS = 30  # a clean table older than this is measured again (libraries, firmware, neighbours)
LOCK_WAIT_S = 60.0  # a probe waits at most this long for another process's probe (_probe_lock)
STATUSES = ("clean", "noisy", "loaded")
_TABLES: dict = {}  # cache key -> table (this process's memo of the probe or the cache file)
_NOTICES: list = []  # this process's measurements not yet told (take_notices)
_LOCK = threading.Lock()


# ---- the cache's key -----------------------------------------------------------------------
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
        return None, f"a damaged table in {path}, discarded"
    return table, None


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x >= 0


def _per_library(d) -> bool:
    return isinstance(d, dict) and set(d) == set(LIBS) and all(_number(v) for v in d.values())


def _valid_load(load) -> bool:
    """The probe's load as its readers take it (``cpu_blas_table``, ``describe``): other processes'
    cores (a number, or None: unknown) and how they were read (text)."""
    return (
        isinstance(load, dict)
        and "other_cores" in load
        and (load["other_cores"] is None or _number(load["other_cores"]))
        and isinstance(load.get("method"), str)
    )


def valid_table(table) -> bool:
    """Whether a cached table is whole, every field of the type the program reads (a file written
    by another version, truncated, edited or raced over is used whole or not at all): the choice
    and GF/s of every entry, each entry's measurement, the status and its why, the load, the
    date, the seconds; the load's other cores and method, the method's margin."""
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
            and _valid_load(table["load"])
            and isinstance(table["method"], dict)
            and _number(table["method"]["margin"])
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
        _remove_stale_tmp(path)
        _replace_atomically(path, json.dumps(data, indent=1, sort_keys=True))
        return None
    except (OSError, TypeError, ValueError) as e:
        return f"{type(e).__name__}: {e}"


def _replace_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path`` (``.cpu_blas.json.<pid>.<random>.tmp``),
    then rename it over ``path``; the temporary file is removed on any exception (Ctrl-C too)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine (one of another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    except OSError:
        return True
    return True


def _remove_stale_tmp(path: Path) -> None:
    """Remove the temporary files beside ``path`` that writers no longer running left behind
    (``.cpu_blas.json.<pid>[.<random>].tmp``: killed between the write and the rename); those of
    live processes, and any that cannot be removed, stay."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 :].split(".")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
            with contextlib.suppress(OSError):
                tmp.unlink()


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
                _NOTICES.append(notice(_TABLES[key]))
        return _TABLES[key]


def notice(r: Resolved) -> str | None:
    """The one line a user is told when a process changed the cache's state: it measured (why,
    how long, clean or not, cached or not); None for a table used as the cache holds it (a
    loaded one left as it is on a busy machine too: it was told when it was measured)."""
    if r.source != "probe" or r.table is None:
        return None
    t = r.table
    line = f"cpu BLAS choice measured in {t['seconds']:.1f} s ({r.remeasured_because})"
    if t["status"] != "clean":
        line += f" on a {t['status']} machine ({t['why']}): used for this run only, measured again by the next"
    line += f"; not cached ({r.cache_error})" if r.cache_error else f"; cached in {cache_path()}"
    return line + " (dfmp2 bench --blas re-measures, --cpu-blas torch or openblas measures nothing)"


def take_notices() -> list[str]:
    """The notices (``notice``) of the measurements this process made since the last call, each once."""
    with _LOCK:
        out = [n for n in _NOTICES if n]
        _NOTICES.clear()
    return out


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
        measured again by the next) or could not be cached; None otherwise. Recorded in the
        result's ``ran.cpu_blas``; a result's ``warnings`` carry it only where the table changed
        the run (dfmp2.drivers.energy.blas_warnings)."""
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
