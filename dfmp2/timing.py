"""Wall-clock seconds and executed flops per named stage, below every stage that times itself."""

from __future__ import annotations

import time

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

    def __init__(self, backend, on_stage=None):
        """``on_stage(stage, seconds)``: called at each ``add`` (a long stage's progress lines)."""
        self.backend, self.seconds, self.flops, self.peak_rss_mb = backend, {}, {}, {}
        self.on_stage = on_stage
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
        if self.on_stage is not None:
            self.on_stage(stage, t1 - t0)
        return t1

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
