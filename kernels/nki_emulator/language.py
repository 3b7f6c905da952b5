"""The subset of ``nki.language`` (nl) that dfmp2's kernels use, executed with NumPy.

Implemented: ``ndarray``; the dtype ``float32``; the memory regions ``sbuf``, ``psum``,
``hbm`` (= ``private_hbm``), ``shared_hbm``; ``tile_size`` (pmax, gemm_stationary_fmax,
gemm_moving_fmax, psum_bank_fmax, psum_fmax, psum_num_banks, sbuf_fmax_bytes); and the
ALU operators ``add``, ``subtract``, ``multiply``, ``maximum``, ``minimum`` as ``op``
arguments of nki.isa instructions (table "Supported Math Operators for NKI ISA",
nki.api.shared). Calling an operator directly as a high-level tile op (``nl.add(a, b)``)
is outside the subset and raises.

Loops are plain Python ``range``: the NKI Language Guide unrolls every ``for`` loop at
specialisation time and the nl.affine_range reference calls it an alias of ``range``.
"""

from __future__ import annotations

import numpy as np

from .core import current_core
from .errors import UnsupportedError
from .tensor import MemoryRegion, Tensor, allocate

float32 = np.dtype(np.float32)

sbuf = MemoryRegion.sbuf
psum = MemoryRegion.psum
private_hbm = MemoryRegion.private_hbm
hbm = MemoryRegion.private_hbm
shared_hbm = MemoryRegion.shared_hbm


def ndarray(shape, dtype, buffer=sbuf, name: str = "") -> Tensor:
    """Uninitialised tensor on ``buffer`` (nki.language.ndarray)."""
    if not isinstance(buffer, MemoryRegion):
        raise UnsupportedError(f"nl.ndarray: buffer {buffer!r} is not an emulator memory region")
    return allocate(shape, dtype, buffer, name)


class _TileSize:
    """nki.language.tile_size for the target of the current launch."""

    @property
    def pmax(self):
        return current_core().limits.pmax

    @property
    def gemm_stationary_fmax(self):
        return current_core().limits.gemm_stationary_fmax

    @property
    def gemm_moving_fmax(self):
        return current_core().limits.gemm_moving_fmax

    @property
    def psum_bank_fmax(self):
        return current_core().limits.psum_bank_fmax

    psum_fmax = psum_bank_fmax  # deprecated alias in NKI 0.4

    @property
    def psum_num_banks(self):
        return current_core().limits.psum_num_banks

    @property
    def sbuf_fmax_bytes(self):
        return current_core().limits.sbuf_partition_bytes


tile_size = _TileSize()


class AluOp:
    """An ALU operator token for the ``op`` fields of nki.isa instructions."""

    def __init__(self, name, fn, reducible):
        self.name, self.fn, self.reducible = name, fn, reducible

    def __call__(self, *args, **kwargs):
        raise UnsupportedError(
            f"nl.{self.name} as a high-level tile op is outside the emulator subset; "
            f"use it as the op of an nki.isa instruction"
        )

    def __repr__(self):
        return f"nl.{self.name}"


add = AluOp("add", np.add, True)
subtract = AluOp("subtract", np.subtract, True)
multiply = AluOp("multiply", np.multiply, True)
maximum = AluOp("maximum", np.maximum, True)
minimum = AluOp("minimum", np.minimum, True)
