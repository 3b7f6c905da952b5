"""Wall-clock seconds and executed flops per named stage, below every stage that times itself."""

from __future__ import annotations

import bisect
import contextlib
import os
import re
import sys
import time
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dfmp2.memory import peak_rss_mb, release_freed


class Timer:
    """Wall-clock seconds per stage (``seconds``: {stage: s}), synchronising the device before
    each reading so queued device work is charged to the stage that queued it; and the flops the
    stage executed through ``dfmp2.linalg`` (``flops``: {stage: flops}; linalg.flops says how each
    op is counted), read from the watched backends' counters (``Backend.flops_executed``).

    Stages run one after another on one thread, so an ``add`` charges the flops executed since the
    previous ``add`` (not since its ``t0``): a stage whose t0 is not the previous reading (the MP2
    stage's transform, timed from its loop's start) still gets exactly its own. Two patterns need
    ``flops0`` (a reading of ``executed()`` taken with t0): an aside timed inside a stage that is
    still running (the DF-SCF's fp64 host rebuilds, kept out of 'scf' by moving its t0), whose
    flops are then kept out of that stage too; and a stage that encloses stages added before it
    (the gradient's 'grad_jk_factor' around the JK factor's 'scf_integrals' and 'scf_fit'), whose
    flops, like its seconds, then include theirs. Work outside linalg (libcint, PySCF, numpy on
    the host) is not counted: a stage of such work alone has 0 flops.

    ``peak_rss_mb``: {stage: the process's peak resident memory (MB) when the stage last ended}
    (``memory.peak_rss_mb``, a high-water mark), to hold the memory plan against what the process
    really used. Stages listed in the order they first ended; one that ends again later (the
    SCF's one-electron integrals, charged to 'scf_integrals') reads the mark of then. Each ``add``
    then hands the heap memory freed so far back to the OS (``memory.release_freed``), so what one
    stage freed is not resident beside the next stage's blocks."""

    def __init__(self, backend, on_stage=None, profile=None):
        """``on_stage(stage, seconds)``: called at each ``add`` (a long stage's progress lines);
        ``profile``: a ``Profile`` told of each stage's end (``dfmp2 run --profile``)."""
        self.backend, self.seconds, self.flops, self.peak_rss_mb = backend, {}, {}, {}
        self.on_stage, self.profile = on_stage, profile
        self.backends = [backend]
        self.mark = self.executed()  # the reading at the last add (or now)
        self.aside = 0  # flops since ``mark`` already charged to an aside

    def watch(self, backend) -> None:
        """Also count ``backend``'s flops from now on (a stage's second backend: the DF-SCF's
        host backend for its dense fp64 algebra on a device without fp64)."""
        if all(b is not backend for b in self.backends):
            self.backends.append(backend)
            self.mark += backend.flops_executed()

    def executed(self) -> int:
        """Flops executed so far on the watched backends."""
        return sum(b.flops_executed() for b in self.backends)

    def add(self, stage: str, t0: float, sync: bool = True, flops0: int | None = None) -> float:
        """Charge the time since t0 to ``stage`` and return now; sync=False for host-only work,
        so queued device work (and its overlap with the host) is not interrupted. Flops: those
        since the previous add, or, with ``flops0`` (``executed()`` at t0), those since flops0,
        which the stage still open at the previous add then does not get (see the class)."""
        if sync:
            self.backend.synchronize()
        t1 = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (t1 - t0)
        now = self.executed()
        if flops0 is None:
            n, self.mark, self.aside = now - self.mark - self.aside, now, 0
        else:
            n = now - flops0
            self.aside += now - max(flops0, self.mark + self.aside)
        self.flops[stage] = self.flops.get(stage, 0) + n
        self.peak_rss_mb[stage] = peak_rss_mb()
        release_freed()  # what the stage freed leaves the process before the next stage maps its own
        if self.profile is not None:
            self.profile.stage_end(stage, t1 - t0)
        if self.on_stage is not None:
            self.on_stage(stage, t1 - t0)
        return t1

    def region(self, name: str):
        """A context of a part of a stage the profile times apart (the SCF's J/K, diagonalisation,
        DIIS ...): ``Profile.region``; nothing without a profile."""
        return self.profile.region(name) if self.profile is not None else contextlib.nullcontext()

    def stage_rss(self) -> dict:
        """{stage: peak RSS MB} for every stage of ``seconds``, in its order (a stage whose seconds
        were moved to it without an ``add`` gets the reading of the stage before it)."""
        out, last = {}, 0.0
        for stage in self.seconds:
            last = self.peak_rss_mb.get(stage, last)
            out[stage] = last
        return out

    def stage_flops(self) -> dict:
        """{stage: flops} for every stage of ``seconds``, in its order (0 where no linalg op ran,
        or where a stage's seconds were moved to it, as the MP2 stage's 'integrals')."""
        return {stage: self.flops.get(stage, 0) for stage in self.seconds}


class CycleLog:
    """Progress of an SCF: one line per cycle through ``say`` (cycle, the precision of its J/K
    when given, E in Hartree, ΔE, orbital gradient norm, seconds since the SCF began). Lines are
    held back until the SCF has run
    ``after`` seconds, then the held ones and every later one go out, so a short SCF prints
    nothing and a long one every cycle."""

    def __init__(self, say, what: str, after: float = 2.0):
        self.say, self.what, self.after = say, what, after
        self.t0, self.open = time.perf_counter(), after <= 0
        self.held: list = []

    def __call__(self, cycle: int, e_tot: float, d_e: float, gnorm: float, precision: str | None = None) -> None:
        dt = time.perf_counter() - self.t0
        line = (
            f"{self.what} cycle {cycle:3d}{f' [{precision}]' if precision else ''}: E = {e_tot:.10f} Eh, "
            f"ΔE = {d_e:+.2e} Eh, |g| = {gnorm:.2e}, {dt:.1f} s"
        )
        if not self.open and dt >= self.after:
            self.open = True
            for held in self.held:
                self.say(held)
            self.held = []
        if self.open:
            self.say(line)
        else:
            self.held.append(line)


# ------------------------------------------------------------------ the profile (dfmp2 run --profile)
PROFILE_TOP = 15  # rows of the profile's top kernels
_HOST = torch.device("cpu")  # torch's host memory (not a device name of ours: those live in linalg)
# aten ops whose result the host waits for: a scalar read, or an output whose shape depends on the data
_HOST_WAITS = ("_local_scalar_dense", "nonzero", "is_nonzero", "equal", "masked_select", "_unique2", "unique_dim")


def moved(src: torch.device, dst: torch.device) -> str | None:
    """Which way a copy from ``src`` to ``dst`` crosses: 'h2d' (host to a device), 'd2h', 'd2d'
    (between two devices), or None (no crossing)."""
    if src == dst:
        return None
    if src.type == _HOST.type:
        return "h2d"
    return "d2h" if dst.type == _HOST.type else "d2d"


class TransferCounter(TorchDispatchMode):
    """Counts, on the thread that enters it, the bytes torch copies between the host and a device
    (``bytes``: {'h2d', 'd2h', 'd2d'}: aten's _to_copy and copy_ across devices, a scalar read of
    a device tensor as its element size), the aten ops dispatched (``ops``: each one kernel or
    more on a device) and the host's waits for device results (``waits``: scalar reads, and ops
    whose output shape depends on the data, as nonzero). Work outside torch's dispatcher is not
    seen: Triton launches (no copies), CuPy's (gpu4pyscf's integrals, handed over by DLPack
    without a copy), and copies made on other threads (the host engine's background thread only
    fills host buffers). On a CPU run every count of bytes is 0, and the ops and waits are the
    same as a device run's."""

    def __init__(self):
        super().__init__()
        self.bytes = {"h2d": 0, "d2h": 0, "d2d": 0}
        self.ops = self.waits = 0

    def reading(self) -> dict:
        return {**self.bytes, "ops": self.ops, "waits": self.waits}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        name = func._overloadpacket.__name__
        if name == "_to_copy" and isinstance(out, torch.Tensor):
            self._count(args[0].device, out.device, out)
        elif name == "copy_":
            self._count(args[1].device, args[0].device, args[0])
        elif name in _HOST_WAITS:
            self.waits += 1
            if name == "_local_scalar_dense" and args[0].device.type != _HOST.type:
                self.bytes["d2h"] += args[0].element_size()
        return out

    def _count(self, src, dst, t: torch.Tensor) -> None:
        way = moved(torch.device(src), torch.device(dst))
        if way is not None:
            self.bytes[way] += t.numel() * t.element_size()


@contextlib.contextmanager
def _no_fd2():
    """Standard error (file descriptor 2) to /dev/null while the profiler starts or stops: Kineto
    prints a line at each (profiler_start, profiler_stop) that no option turns off. An exception
    raised inside still reaches the caller, with fd 2 restored."""
    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _delta(now: dict, then: dict) -> dict:
    return {k: v - then.get(k, 0) for k, v in now.items()}


def _add_into(acc: dict, d: dict) -> None:
    for k, v in d.items():
        acc[k] = acc.get(k, 0) + v


class Profile:
    """Where a run's time and bytes go (``dfmp2 run --profile``): per stage of the Timer (its
    seconds, the host's CPU seconds over all threads, the device's busy seconds, the bytes moved
    host->device and device->host, the aten ops dispatched and the host's waits), per region of
    the SCF's cycles (``Timer.region``: J/K, diagonalisation, density, DIIS, the energy and
    gradient checks; each region ends with a device synchronisation, so its seconds are its own
    work, and the cycles' queue is drained a few more times than in a plain run), and the top
    kernels: the device's by busy time on a CUDA device (torch.profiler's CUDA activity), else the
    torch ops by self CPU time (on the CPU the host is the device: busy seconds are null there).

    Counts since the previous stage's end are that stage's (as the Timer's flops). Bytes and ops:
    ``TransferCounter`` (on this thread); device busy seconds and the copies' seconds:
    torch.profiler's device events, each charged to the stage or region in whose window it starts
    (windows from markers recorded at each stage's end). A ``with`` block holds the profiler."""

    def __init__(self, backend):
        self.device = torch.device(getattr(backend, "device", _HOST))
        self.cuda = bool(backend.caps.cuda_memory)  # a CUDA GPU: torch.profiler's CUDA activity too
        self.backend, self.counter = backend, TransferCounter()
        self.stages: dict = {}  # stage -> summed counts
        self.regions: dict = {}  # region -> summed counts and calls
        self.prof: Any = None  # torch.profiler.profile while the block runs
        self.events: Any = None

    def _reading(self) -> dict:
        return {**self.counter.reading(), "host_cpu_s": time.process_time()}

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile

        self.t_begin = time.perf_counter()
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=acts)
        with _no_fd2():
            self.prof.__enter__()
        self.counter.__enter__()
        self.mark = self._reading()
        self.t_enter = self.first_start = self.last_end = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.t_exit = time.perf_counter()
        self.counter.__exit__(*exc)
        with _no_fd2():
            self.prof.__exit__(*exc)
        self.events = _raw_events(self.prof)
        self.stop_s = time.perf_counter() - self.t_exit  # the profiler's own: its events parsed
        return False

    def stage_end(self, stage: str, seconds: float) -> None:
        """At a Timer's ``add``: this stage's counts since the previous end, and its marker."""
        from torch.profiler import record_function

        now, t1 = self._reading(), time.perf_counter()
        if not self.stages:
            self.first_start = t1 - seconds
        self.last_end = t1
        entry = self.stages.setdefault(stage, {"wall_s": 0.0})
        entry["wall_s"] += seconds
        _add_into(entry, _delta(now, self.mark))
        with record_function(f"dfmp2.stage:{stage}"):  # the end of its window of device events
            pass
        self.mark = self._reading()

    @contextlib.contextmanager
    def region(self, name: str):
        """A region of the SCF's cycles: its wall seconds (the device synchronised at its end) and
        counts, summed over its calls."""
        from torch.profiler import record_function

        r0, t0 = self._reading(), time.perf_counter()
        with record_function(f"dfmp2.region:{name}"):
            yield
            self.backend.synchronize()
        entry = self.regions.setdefault(name, {"calls": 0, "wall_s": 0.0})
        entry["calls"] += 1
        entry["wall_s"] += time.perf_counter() - t0
        _add_into(entry, _delta(self._reading(), r0))

    # ---- the record
    def report(self, seconds: dict, wall_s: float, cycles: int | None, t_start: float | None = None) -> dict:
        """The profile's record (``Result.profile``): units in the names (s, bytes). ``seconds``:
        the Timer's, each stage's wall seconds (the MP2 stage moves its integrals' seconds out of
        its transform's: their counts stay with the transform); ``cycles``: the SCF's iterations
        (the regions' per-cycle means), None without our SCF; ``t_start``: the perf_counter
        reading when the run began (its ``prepare``), for the set-up's parts outside the stages."""
        cuda = self.cuda
        dev = _device_events(self.events) if cuda else None
        n_dev = sum(k["calls"] for k in dev["kernels_all"].values()) if dev is not None else None
        note = None
        if dev is not None and not n_dev:  # CUPTI gave nothing: the device's seconds are unknown, not 0
            note = "torch.profiler recorded no CUDA events (is CUPTI available?): device seconds unknown"
            dev = None
        stages = {
            s: _counts({**self.stages.get(s, {}), "wall_s": t}, dev and dev["stages"].get(s, {}))
            for s, t in seconds.items()
        }
        regions = {
            r: {"calls": c["calls"], **_counts(c, dev and dev["regions"].get(r, {}))} for r, c in self.regions.items()
        }
        if cycles:
            for r in regions.values():
                r["per_cycle_s"] = r["wall_s"] / cycles
        staged = sum(seconds.values())
        return {
            "device": str(self.device),
            "tools": "torch.profiler (activities: CPU"
            + (", CUDA)" if cuda else ")")
            + "; dfmp2.timing.TransferCounter (aten copies and ops on the run's thread)",
            "wall_s": wall_s,
            "outside_stages_s": wall_s - staged,
            "set_up": {  # where the seconds outside the stages went (s)
                "prepare_s": self.t_begin - t_start if t_start is not None else None,
                "profiler_start_s": self.t_enter - self.t_begin,
                "until_first_stage_s": self.first_start - self.t_enter,
                "after_last_stage_s": self.t_exit - self.last_end,
                "profiler_stop_s": self.stop_s,
            },
            "stages": stages,
            "scf_cycles": cycles,
            "scf_regions": regions,
            "top_kernels": dev["kernels"] if dev is not None else _top_ops(self.events),  # CPU ops without CUDA's
            "top_kernels_by": "device busy seconds (CUDA kernels, copies, memsets)"
            if dev is not None
            else "self CPU seconds of torch ops" + (" (no CUDA events)" if cuda else " (the host is the device)"),
            "memcpy": dev["memcpy"] if dev is not None else None,
            "device_events": n_dev,
            "note": note,
        }


def _counts(c: dict, dev: dict | None) -> dict:
    """A stage's or region's counts for the record; ``dev``: its device busy and copy seconds on a
    CUDA device, None on the CPU (the host is the device: those are null)."""
    return {
        "wall_s": c["wall_s"],
        "host_cpu_s": c.get("host_cpu_s", 0.0),
        "device_busy_s": dev.get("busy_s", 0.0) if dev is not None else None,
        "memcpy_s": dev.get("memcpy_s", 0.0) if dev is not None else None,
        "h2d_bytes": c.get("h2d", 0),
        "d2h_bytes": c.get("d2h", 0),
        "d2d_bytes": c.get("d2d", 0),
        "ops": c.get("ops", 0),
        "host_waits": c.get("waits", 0),
    }


def _raw_events(prof) -> list:
    """The profiler's events as (name, on_device, start_us, end_us, thread, event), read from
    Kineto's results directly: torch's FunctionEvent tree (``prof.events()``) takes seconds per
    10^5 events, and a run makes several 10^5. ``on_device``: the device's own work (kernels,
    copies, memsets). The spans Kineto draws on the device's timeline for our markers (activity
    'gpu_user_annotation') are left out: they cover kernels counted already, and the stages'
    windows come from the host's markers."""
    from torch.autograd import DeviceType

    def device_annotation(e) -> bool:
        kind = e.activity_type() if callable(getattr(e, "activity_type", None)) else ""
        return e.device_type() != DeviceType.CPU and ("annotation" in str(kind) or e.name().startswith("dfmp2."))

    res = prof.profiler.kineto_results
    return [
        (e.name(), e.device_type() != DeviceType.CPU, e.start_ns() / 1e3, e.end_ns() / 1e3, e.start_thread_id(), e)
        for e in (res.events() if res is not None else ())
        if not device_annotation(e)
    ]


def _top_ops(events, top: int = PROFILE_TOP) -> list:
    """The torch ops with the most self CPU time (an op's time less that of the ops it encloses on
    its thread), without the profile's own markers and the counter's dispatch."""
    self_us: dict = {}
    calls: dict = {}
    by_thread: dict = {}
    for name, on_device, t0, t1, thread, _ in events:
        if not on_device:
            by_thread.setdefault(thread, []).append((t0, -t1, name))
    for evs in by_thread.values():
        stack: list = []  # [end, name]
        for t0, neg_t1, name in sorted(evs):
            while stack and stack[-1][0] <= t0:
                stack.pop()
            if stack:
                self_us[stack[-1][1]] = self_us.get(stack[-1][1], 0.0) - (-neg_t1 - t0)
            self_us[name] = self_us.get(name, 0.0) + (-neg_t1 - t0)
            calls[name] = calls.get(name, 0) + 1
            stack.append((-neg_t1, name))
    rows = [
        {"name": n, "calls": calls[n], "seconds": max(us, 0.0) / 1e6}
        for n, us in self_us.items()
        if not n.startswith("dfmp2.") and n != "PythonDispatchMode"  # the counter's own dispatch
    ]
    return sorted(rows, key=lambda r: -r["seconds"])[:top]


def _copy_bytes(e) -> int | None:
    """The bytes of a device copy event (Kineto's metadata: '"bytes": N'), None when not given."""
    meta = e.metadata_json() if hasattr(e, "metadata_json") else None  # not in every torch's Kineto bindings
    m = re.search(r'"bytes":\s*(\d+)', str(meta or ""))
    return int(m.group(1)) if m else None


def _device_events(events, top: int = PROFILE_TOP) -> dict:
    """Device events (not the host's) charged to the stage whose window holds their start (the
    windows end at the stages' markers; a stage ends with a device synchronisation, so its
    kernels start before its marker) and to the SCF region whose window holds it; the top kernels
    by busy seconds; the copies by direction (Kineto names them 'Memcpy HtoD', 'DtoH', 'DtoD')."""
    marks = sorted((t0, label.split(":", 1)[1]) for label, _, t0, _, _, _ in events if label.startswith("dfmp2.stage:"))
    wins = sorted(
        (t0, t1, label.split(":", 1)[1]) for label, _, t0, t1, _, _ in events if label.startswith("dfmp2.region:")
    )
    starts, rstarts = [m[0] for m in marks], [w[0] for w in wins]
    stages: dict = {}
    regions: dict = {}
    kernels: dict = {}
    memcpy: dict = {
        way: {"calls": 0, "seconds": 0.0, "bytes": 0, "bytes_known": True} for way in ("HtoD", "DtoH", "DtoD")
    }
    for label, on_device, t, t_end, _, e in events:
        if not on_device:
            continue
        dt = (t_end - t) / 1e6
        i = bisect.bisect_left(starts, t)
        where = [stages.setdefault(marks[i][1] if i < len(marks) else "(after the last stage)", {})]
        j = bisect.bisect_right(rstarts, t) - 1
        if j >= 0 and t <= wins[j][1]:
            where.append(regions.setdefault(wins[j][2], {}))
        is_copy = label.startswith("Memcpy")
        for w in where:
            w["busy_s"] = w.get("busy_s", 0.0) + dt
            w["memcpy_s"] = w.get("memcpy_s", 0.0) + (dt if is_copy else 0.0)
        k = kernels.setdefault(label, {"name": label, "calls": 0, "seconds": 0.0})
        k["calls"] += 1
        k["seconds"] += dt
        way = next((w for w in memcpy if w in label), None)
        if is_copy and way is not None:
            n = _copy_bytes(e)
            memcpy[way]["calls"] += 1
            memcpy[way]["seconds"] += dt
            memcpy[way]["bytes"] += n or 0
            memcpy[way]["bytes_known"] = bool(memcpy[way]["bytes_known"]) and n is not None
    busy = sum(k["seconds"] for k in kernels.values()) or 1.0
    rows = sorted(kernels.values(), key=lambda r: -r["seconds"])[:top]
    for r in rows:
        r["share"] = r["seconds"] / busy
    return {"stages": stages, "regions": regions, "kernels": rows, "memcpy": memcpy, "kernels_all": kernels}
