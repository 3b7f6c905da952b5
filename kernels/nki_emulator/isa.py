"""The subset of ``nki.isa`` (nisa) that dfmp2's kernels use, executed with NumPy.

Implemented instructions (signatures and rules from the nki.isa API reference):
``dma_copy``, ``tensor_copy``, ``memset``, ``nc_matmul``, ``tensor_tensor``,
``tensor_scalar``, ``tensor_reduce``, ``reciprocal``. Arithmetic is done in float32, as
the engines do (nki.isa.tensor_tensor / tensor_scalar / tensor_reduce: "casts input data
types to float32 and performs the operation in float32 math"; nc_matmul accumulates in
float32 in PSUM).

Every instruction checks what its reference page states and raises on a violation:
memory types (matmul operands in SBUF, result in PSUM; DMA between HBM and SBUF; not
both tensor_tensor inputs in PSUM), partition limits and the start-partition rule of the
Trainium architecture guide, matmul tile sizes, PSUM accumulate rules, dtypes. Where the
emulator is stricter than the hardware (identical shapes instead of equal element
counts, no cross-partition moves, fp32-only matmul), the error says it is the subset.
"""

from __future__ import annotations

import numpy as np

from .core import current_core
from .errors import HardwareLimitError, NkiEmulatorError, UnsupportedError
from .language import AluOp
from .tensor import MemoryRegion, Tensor

_F32 = np.float32
SBUF, PSUM = MemoryRegion.sbuf, MemoryRegion.psum


def _tensor(t, what):
    if not isinstance(t, Tensor):
        raise NkiEmulatorError(f"{what}: expected an NKI tensor, got {type(t).__name__}")
    return t


def _on_chip(t, what, allowed=(SBUF, PSUM)):
    _tensor(t, what)
    if t.buffer not in allowed:
        names = " or ".join(b.value.upper() for b in allowed)
        raise NkiEmulatorError(f"{what}: {t!r} must be in {names}")
    lim = current_core().limits
    n, p0 = t.shape[0], t.p0
    if n > lim.pmax:
        raise HardwareLimitError(f"{what}: {t!r} spans {n} partitions; the maximum is {lim.pmax}")
    # Trainium architecture guide, "start_partition" rule for instruction operands.
    ok = p0 == 0 if n > 64 else (p0 in (0, 64) if n > 32 else p0 in (0, 32, 64, 96))
    if not ok:
        raise HardwareLimitError(
            f"{what}: {t!r} occupies {n} partitions starting at {p0}; "
            "that start partition is not allowed for this partition count"
        )
    return t


def _same_partitions(what, *ts):
    first = ts[0]
    for t in ts[1:]:
        if (t.shape[0], t.p0) != (first.shape[0], first.p0):
            raise UnsupportedError(
                f"{what}: {first!r} and {t!r} occupy different partitions; "
                "cross-partition movement is outside the emulator subset"
            )


def _same_shape(what, *ts):
    for t in ts[1:]:
        if t.shape != ts[0].shape:
            raise UnsupportedError(
                f"{what}: shapes {ts[0].shape} and {t.shape} differ (the emulator requires identical tile shapes)"
            )


def _alu(op, what, reduce=False):
    if not isinstance(op, AluOp):
        raise UnsupportedError(f"{what}: operator {op!r} is outside the emulator subset")
    if reduce and not op.reducible:
        raise NkiEmulatorError(f"{what}: {op!r} is not a legal reduction operator")
    return op


def _writable(t, what):
    if not t._data.flags.writeable:
        raise NkiEmulatorError(f"{what}: {t!r} is a kernel input; the emulator keeps inputs read-only")


def dma_copy(dst, src, name=None):
    """dst = src between HBM and SBUF (nki.isa.dma_copy)."""
    what = "nisa.dma_copy"
    for t in (_tensor(dst, what), _tensor(src, what)):
        if t.buffer is PSUM:
            raise NkiEmulatorError(f"{what}: {t!r} is in PSUM; DMA moves data between HBM and SBUF")
        if t.on_chip:
            _on_chip(t, what)
    if dst.size != src.size:
        raise NkiEmulatorError(f"{what}: src has {src.size} elements, dst {dst.size}")
    _same_shape(what, dst, src)
    _writable(dst, what)
    # DMA converts through float32 (nki.isa.dma_copy, "Data types").
    dst.write(src.read(what).astype(_F32, copy=False))
    current_core().count("dma_copy", dma_bytes=src.size * src.dtype.itemsize)


def tensor_copy(dst, src, engine=None, name=None):
    """dst = src within SBUF/PSUM (nki.isa.tensor_copy)."""
    what = "nisa.tensor_copy"
    _on_chip(dst, what)
    _on_chip(src, what)
    _same_shape(what, dst, src)
    _same_partitions(what, dst, src)
    dst.write(src.read(what).astype(_F32, copy=False))
    current_core().count("tensor_copy")


def memset(dst, value, engine=None, name=None):
    """Fill dst with a compile-time constant (nki.isa.memset)."""
    what = "nisa.memset"
    _on_chip(dst, what)
    if not isinstance(value, (int, float)):
        raise NkiEmulatorError(f"{what}: value must be a compile-time constant number")
    dst.write(value)
    current_core().count("memset")


def nc_matmul(dst, stationary, moving, accumulate=None, name=None):  # noqa: C901
    """dst = stationary.T @ moving on the Tensor Engine (nki.isa.nc_matmul).

    stationary: SBUF (K, M), moving: SBUF (K, N), dst: PSUM (M, N) fp32; K <= 128
    partitions, M <= gemm_stationary_fmax (128), N <= gemm_moving_fmax (512).
    accumulate=False overwrites, True adds to a PSUM region that an earlier nc_matmul
    initialised, None decides from whether this region was written by nc_matmul before.
    """
    what = "nisa.nc_matmul"
    lim = current_core().limits
    _on_chip(stationary, what + " stationary", (SBUF,))
    _on_chip(moving, what + " moving", (SBUF,))
    _on_chip(dst, what + " dst", (PSUM,))
    for t in (stationary, moving, dst):
        if t.dtype != _F32:
            raise UnsupportedError(f"{what}: {t!r} is {t.dtype}; the emulator implements fp32 matmul only")
    K, M = stationary.shape
    K2, N = moving.shape
    if K != K2:
        raise HardwareLimitError(
            f"{what}: stationary has {K} partitions and moving {K2}; "
            "the contraction (partition) sizes must be identical"
        )
    if M > lim.gemm_stationary_fmax:
        raise HardwareLimitError(
            f"{what}: stationary free size {M} exceeds gemm_stationary_fmax = {lim.gemm_stationary_fmax}"
        )
    if N > lim.gemm_moving_fmax:
        raise HardwareLimitError(
            f"{what}: moving free size {N} exceeds gemm_moving_fmax = {lim.gemm_moving_fmax} (one PSUM bank of fp32)"
        )
    if dst.shape != (M, N):
        raise NkiEmulatorError(f"{what}: dst shape {dst.shape} must be (stationary free, moving free) = {(M, N)}")
    if stationary.p0 != moving.p0:
        raise UnsupportedError(f"{what}: stationary and moving start at different partitions")
    mm, written = dst._mm, dst._written
    if accumulate is None:
        if mm.all():
            accumulate = True
        elif not written.any():
            accumulate = False
        else:
            raise NkiEmulatorError(f"{what}: dst {dst!r} is partly initialised; pass accumulate explicitly")
    if accumulate:
        if not mm.all():
            raise NkiEmulatorError(
                f"{what}: accumulate=True on a PSUM region not initialised by an earlier nc_matmul "
                "(undefined behaviour on NeuronCore-v2/v3; start with accumulate=False)"
            )
    # einsum without BLAS: one thread, fp32 sums of at most 128 products, and predictable
    # speed on a loaded machine (threaded BLAS on tiny tiles thrashes there).
    prod = np.einsum("km,kn->mn", stationary.read(what), moving.read(what), optimize=False)
    dst.write(dst._data + prod if accumulate else prod, by_matmul=True)
    current_core().count("nc_matmul", flops=2 * K * M * N)


def tensor_tensor(dst, data1, data2, op, engine=None, name=None):
    """dst = data1 <op> data2 elementwise (nki.isa.tensor_tensor)."""
    what = "nisa.tensor_tensor"
    op = _alu(op, what)
    for t in (dst, data1, data2):
        _on_chip(t, what)
    if data1.buffer is PSUM and data2.buffer is PSUM:
        raise NkiEmulatorError(f"{what}: data1 and data2 cannot both be in PSUM")
    _same_shape(what, dst, data1, data2)
    _same_partitions(what, dst, data1, data2)
    a = data1.read(what).astype(_F32, copy=False)
    b = data2.read(what).astype(_F32, copy=False)
    dst.write(op.fn(a, b))
    current_core().count("tensor_tensor")


def _scalar_operand(x, data, what):
    if isinstance(x, Tensor):
        _on_chip(x, what)
        if x.shape != (data.shape[0], 1):
            raise NkiEmulatorError(f"{what}: vector operand {x!r} must have shape ({data.shape[0]}, 1)")
        if x.dtype != _F32:
            raise NkiEmulatorError(f"{what}: vector operands must be float32")
        _same_partitions(what, data, x)
        return x.read(what)
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return _F32(x)
    raise NkiEmulatorError(f"{what}: operand must be a number or a (P, 1) tile, got {x!r}")


def tensor_scalar(  # noqa: PLR0913
    dst, data, op0, operand0, reverse0=False, op1=None, operand1=None, reverse1=False, engine=None, name=None
):
    """dst = (data <op0> operand0) <op1> operand1, operands broadcast along the free dim
    (nki.isa.tensor_scalar); reverse0/1 swap the operand order."""
    what = "nisa.tensor_scalar"
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_shape(what, dst, data)
    _same_partitions(what, dst, data)
    x = data.read(what).astype(_F32, copy=False)
    v0 = _scalar_operand(operand0, data, what)
    op0 = _alu(op0, what)
    x = op0.fn(v0, x) if reverse0 else op0.fn(x, v0)
    if op1 is not None:
        v1 = _scalar_operand(operand1, data, what)
        op1 = _alu(op1, what)
        x = op1.fn(v1, x) if reverse1 else op1.fn(x, v1)
    elif operand1 is not None:
        raise NkiEmulatorError(f"{what}: operand1 given without op1")
    dst.write(x)
    current_core().count("tensor_scalar")


def tensor_reduce(dst, op, data, axis, negate=False, keepdims=False, name=None):
    """Reduce the free axis of a 2-D tile into dst (P, 1) (nki.isa.tensor_reduce)."""
    what = "nisa.tensor_reduce"
    op = _alu(op, what, reduce=True)
    _on_chip(dst, what)
    _on_chip(data, what)
    axes = tuple(axis) if isinstance(axis, (tuple, list)) else (axis,)
    if axes != (1,):
        raise NkiEmulatorError(
            f"{what}: axis {axis!r}; a 2-D tile reduces its free axis 1 (the partition axis 0 cannot be reduced)"
        )
    if dst.shape != (data.shape[0], 1):
        raise NkiEmulatorError(f"{what}: dst {dst.shape} must hold one element per partition ({data.shape[0]}, 1)")
    _same_partitions(what, dst, data)
    r = op.fn.reduce(data.read(what).astype(_F32, copy=False), axis=1, keepdims=True, dtype=_F32)
    dst.write(-r if negate else r)
    current_core().count("tensor_reduce")


def reciprocal(dst, data, name=None):
    """dst = 1 / data elementwise on the Vector Engine (nki.isa.reciprocal)."""
    what = "nisa.reciprocal"
    _on_chip(dst, what)
    _on_chip(data, what)
    _same_shape(what, dst, data)
    _same_partitions(what, dst, data)
    with np.errstate(divide="ignore"):
        dst.write(_F32(1.0) / data.read(what).astype(_F32, copy=False))
    current_core().count("reciprocal")
