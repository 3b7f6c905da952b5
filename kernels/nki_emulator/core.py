"""Per-launch state of the emulated NeuronCore: on-chip memory accounting and counters.

One ``Core`` exists per kernel launch and is made current for the duration of the launch
(a ``contextvars.ContextVar``, so nothing leaks between launches or threads). A tile is
counted as live from ``nl.ndarray`` until its last Python reference is dropped. Inside a
loop that re-binds a tile name, the new tile is allocated before the old one is released,
so the accounting is conservative by one generation of loop-carried tiles.
"""

from __future__ import annotations

import contextvars
from collections import Counter

import numpy as np

from .errors import HardwareLimitError, NkiEmulatorError
from .limits import CoreLimits

_current: contextvars.ContextVar[Core | None] = contextvars.ContextVar("nki_emulator_core", default=None)


class Core:
    """Memory accounting and instruction counters for one launch."""

    def __init__(self, limits: CoreLimits):
        self.limits = limits
        self.sbuf_used = np.zeros(limits.pmax, dtype=np.int64)  # bytes per partition
        self.sbuf_peak = 0
        self.psum_banks_used = 0
        self.psum_peak = 0
        self.instructions: Counter = Counter()
        self.matmul_flops = 0
        self.dma_bytes = 0

    # ---- allocation ----
    def alloc_sbuf(self, partitions: int, bytes_per_partition: int, what: str):
        cap = self.limits.sbuf_partition_bytes
        new = self.sbuf_used[:partitions] + bytes_per_partition
        if new.max(initial=0) > cap:
            raise HardwareLimitError(
                f"SBUF over-full on {self.limits.target}: allocating {what} needs "
                f"{bytes_per_partition} B per partition with {int(self.sbuf_used[:partitions].max())} B "
                f"already live; capacity is {cap} B per partition"
            )
        self.sbuf_used[:partitions] = new
        self.sbuf_peak = max(self.sbuf_peak, int(self.sbuf_used.max()))
        used = self.sbuf_used

        def release():
            used[:partitions] -= bytes_per_partition

        return release

    def alloc_psum(self, what: str):
        """Every PSUM tile occupies one whole 2 KiB bank (tiles are at most one bank wide)."""
        if self.psum_banks_used + 1 > self.limits.psum_num_banks:
            raise HardwareLimitError(
                f"PSUM over-full on {self.limits.target}: allocating {what} needs a bank but all "
                f"{self.limits.psum_num_banks} banks of {self.limits.psum_bank_bytes} B per partition are live"
            )
        self.psum_banks_used += 1
        self.psum_peak = max(self.psum_peak, self.psum_banks_used)

        def release():
            self.psum_banks_used -= 1

        return release

    # ---- counters ----
    def count(self, op: str, flops: int = 0, dma_bytes: int = 0) -> None:
        self.instructions[op] += 1
        self.matmul_flops += flops
        self.dma_bytes += dma_bytes

    def stats(self) -> dict:
        return {
            "instructions": dict(self.instructions),
            "matmul_flops": self.matmul_flops,
            "dma_bytes": self.dma_bytes,
            "sbuf_peak_bytes_per_partition": self.sbuf_peak,
            "psum_peak_banks": self.psum_peak,
        }


def current_core() -> Core:
    core = _current.get()
    if core is None:
        raise NkiEmulatorError(
            "NKI emulator call outside a kernel launch; run kernels through "
            "dfmp2.kernels.nki_emulator.simulate(kernel)(...)"
        )
    return core


def activate(core: Core):
    """Make ``core`` current; returns the token for ``deactivate``."""
    return _current.set(core)


def deactivate(token) -> None:
    _current.reset(token)
