"""Emulated NKI tensors: HBM arrays and 2-D (partition, free) SBUF/PSUM tiles.

Subset implemented (see nki.language.NkiTensor in the NKI API reference):
- attributes ``shape``, ``dtype``, ``buffer``, ``ndim``, ``size``, ``name``;
- indexing with integers and unit-step slices (no negative indices, no empty slices);
  on-chip tensors keep the partition dim when indexed by an integer and must stay 2-D,
  HBM tensors drop integer-indexed dims (NKI Language Guide, "Tensor Indexing").

New allocations hold NaN, as nki.simulate's sentinel does, and every on-chip element
carries a "written" flag so that reading uninitialised SBUF/PSUM raises instead of
silently producing NaN. PSUM elements also carry an "initialised by nc_matmul" flag,
needed for the accumulate rules of nki.isa.nc_matmul.
"""

from __future__ import annotations

import weakref
from enum import Enum

import numpy as np

from .core import current_core
from .errors import HardwareLimitError, NkiEmulatorError, UnsupportedError


class MemoryRegion(Enum):
    sbuf = "sbuf"
    psum = "psum"
    private_hbm = "private_hbm"
    shared_hbm = "shared_hbm"


ON_CHIP = (MemoryRegion.sbuf, MemoryRegion.psum)


class _Storage:
    """One allocation; releases its on-chip accounting when the last view is gone."""

    def __init__(self, data, buffer, release=None):
        self.data = data
        self.buffer = buffer
        on_chip = buffer in ON_CHIP
        self.written = np.zeros(data.shape, dtype=bool) if on_chip else None
        self.mm_init = np.zeros(data.shape, dtype=bool) if buffer is MemoryRegion.psum else None
        if release is not None:
            weakref.finalize(self, release)


class Tensor:
    """An emulated ``NkiTensor`` view."""

    __slots__ = ("__weakref__", "_data", "_mm", "_st", "_written", "buffer", "dtype", "f0", "name", "p0", "shape")

    def __init__(self, storage: _Storage, key, shape, name, p0=0, f0=0):
        self._st = storage
        self._data = storage.data[key]
        self._written = None if storage.written is None else storage.written[key]
        self._mm = None if storage.mm_init is None else storage.mm_init[key]
        self.shape = tuple(shape)
        self.dtype = storage.data.dtype
        self.buffer = storage.buffer
        self.name = name
        self.p0, self.f0 = p0, f0  # start partition / free offset (on-chip views)

    # ---- NkiTensor attributes ----
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))

    @property
    def on_chip(self) -> bool:
        return self.buffer in ON_CHIP

    def __repr__(self):
        return f"Tensor({self.name or '?'}, {self.buffer.value}, {self.shape}, {self.dtype})"

    def __getitem__(self, key) -> Tensor:  # noqa: C901
        if not isinstance(key, tuple):
            key = (key,)
        if len(key) > self.ndim:
            raise IndexError(f"{self!r}: {len(key)} indices for {self.ndim} dims")
        np_key, shape = [], []
        p0, f0 = self.p0, self.f0
        for d, k in enumerate(key):
            n = self.shape[d]
            if isinstance(k, (int, np.integer)) and not isinstance(k, bool):
                k = int(k)
                if not 0 <= k < n:
                    raise IndexError(f"{self!r}: index {k} out of range for dim {d} of size {n}")
                if self.on_chip:
                    if d != 0:
                        raise UnsupportedError(
                            f"{self!r}: integer index on a free dim; the emulator "
                            "keeps on-chip tiles 2-D (partition, free)"
                        )
                    np_key.append(slice(k, k + 1))
                    shape.append(1)
                    p0 += k
                else:
                    np_key.append(k)
            elif isinstance(k, slice):
                if k.step not in (None, 1):
                    raise UnsupportedError(f"{self!r}: strided slices are outside the emulator subset")
                start = 0 if k.start is None else int(k.start)
                stop = n if k.stop is None else int(k.stop)
                if start < 0 or stop > n or start >= stop:
                    raise IndexError(f"{self!r}: slice {start}:{stop} is empty or out of range for dim {d} of size {n}")
                np_key.append(slice(start, stop))
                shape.append(stop - start)
                if self.on_chip:
                    if d == 0:
                        p0 += start
                    else:
                        f0 += start
            else:
                raise UnsupportedError(f"{self!r}: index {k!r} is outside the emulator subset")
        shape.extend(self.shape[len(key) :])
        view = Tensor.__new__(Tensor)
        view._st = self._st
        view._data = self._data[tuple(np_key)]
        view._written = None if self._written is None else self._written[tuple(np_key)]
        view._mm = None if self._mm is None else self._mm[tuple(np_key)]
        view.shape, view.dtype, view.buffer, view.name = tuple(shape), self.dtype, self.buffer, self.name
        view.p0, view.f0 = p0, f0
        return view

    # ---- used by the isa implementations ----
    def read(self, what: str) -> np.ndarray:
        """The values, refusing uninitialised on-chip elements."""
        if self._written is not None and not self._written.all():
            raise NkiEmulatorError(
                f"{what}: reads uninitialised {self.buffer.value} memory in {self!r} "
                "(nl.ndarray does not initialise; write it first)"
            )
        return self._data

    def write(self, values, *, by_matmul: bool = False) -> None:
        self._data[...] = values
        if self._written is not None:
            self._written[...] = True
        if self._mm is not None:
            self._mm[...] = by_matmul


def allocate(shape, dtype, buffer: MemoryRegion, name: str = "") -> Tensor:
    """nl.ndarray: fresh, NaN-filled storage with on-chip accounting in the current launch."""
    core = current_core()
    lim = core.limits
    shape = tuple(int(s) for s in shape)
    if not shape or any(s <= 0 for s in shape):
        raise NkiEmulatorError(f"nl.ndarray: shape must be positive integers, got {shape}")
    dtype = np.dtype(dtype)
    release = None
    label = f"{name or 'tile'} {shape} {dtype}"
    if buffer in ON_CHIP:
        if len(shape) != 2:
            raise UnsupportedError(f"nl.ndarray {label}: the emulator supports 2-D (partition, free) on-chip tiles")
        if shape[0] > lim.pmax:
            raise HardwareLimitError(
                f"nl.ndarray {label}: partition dim {shape[0]} exceeds "
                f"the {lim.pmax} partitions of {buffer.value.upper()}"
            )
        row_bytes = shape[1] * dtype.itemsize
        if buffer is MemoryRegion.psum:
            if row_bytes > lim.psum_bank_bytes:
                raise HardwareLimitError(
                    f"nl.ndarray {label}: {row_bytes} B per partition exceeds one "
                    f"PSUM bank ({lim.psum_bank_bytes} B = {lim.psum_bank_fmax} fp32)"
                )
            release = core.alloc_psum(label)
        else:
            release = core.alloc_sbuf(shape[0], row_bytes, label)
    fill = np.nan if dtype.kind == "f" else 4  # nki.simulate's sentinels
    st = _Storage(np.full(shape, fill, dtype=dtype), buffer, release)
    return Tensor(st, (), shape, name)


def wrap_hbm(array: np.ndarray, name: str) -> Tensor:
    """A kernel argument: a read-only HBM tensor over the caller's array."""
    a = np.asarray(array)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    view = a.view()
    view.flags.writeable = False
    st = _Storage(view, MemoryRegion.shared_hbm)
    return Tensor(st, (), view.shape, name)
