"""numpy's OpenBLAS as a second CPU BLAS next to torch's (MKL in the x86 wheels): what it is
(``numpy_blas_info``), its thread pools, and the zero-copy GEMM ``openblas_matmul``. Which of the
two runs each op is linalg.cpu_blas's choice.

Zero copy: tensors become numpy arrays with ``t.numpy()`` (shared memory) and ``np.matmul`` writes
into a torch-allocated output (``out=``); numpy calls its BLAS's GEMM directly for operands with a
unit stride in either dimension (a transposed view is passed as BLAS's 'T'), and its SYRK for
``x @ x.T`` of one buffer. Other layouts (and 1-D, batched, integer or beta != 0 calls) go to
torch (``openblas_ok`` says which).

Threads: the OpenBLAS pools get torch's thread count (threadpoolctl), set before every call whose
count differs, so the two libraries never run more threads than torch alone; the pair step runs
its OpenBLAS GEMMs on one thread per row as it does torch's (``single_thread``).
"""

from __future__ import annotations

import contextlib
import functools
import re

import numpy as np
import torch


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
        and t.dtype in (torch.float64, torch.float32)
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
