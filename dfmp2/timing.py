"""Wall-clock seconds per named stage, below every stage that times itself."""

from __future__ import annotations

import time


class Timer:
    """Wall-clock seconds per stage (``seconds``: {stage: s}), synchronising the device before
    each reading so queued device work is charged to the stage that queued it."""

    def __init__(self, backend):
        self.backend, self.seconds = backend, {}

    def add(self, stage: str, t0: float, sync: bool = True) -> float:
        """Charge the time since t0 to ``stage`` and return now; sync=False for host-only work,
        so queued device work (and its overlap with the host) is not interrupted."""
        if sync:
            self.backend.synchronize()
        t1 = time.perf_counter()
        self.seconds[stage] = self.seconds.get(stage, 0.0) + (t1 - t0)
        return t1


class CycleLog:
    """Progress of an SCF: one line per cycle through ``say`` (cycle, the precision of its J/K
    when given, E in Hartree, ΔE, orbital gradient norm, seconds since the SCF began). Lines are
    held back until the SCF has run
    ``after`` seconds, then the held ones and every later one go out, so a short SCF prints
    nothing and a long one every cycle."""

    def __init__(self, say, what: str, after: float = 2.0):
        self.say, self.what, self.after = say, what, after
        self.t0, self.held, self.open = time.perf_counter(), [], after <= 0

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
