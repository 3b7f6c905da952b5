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
