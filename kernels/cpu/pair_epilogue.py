"""ctypes entry points of pair_epilogue.c: the MP2 sums of the pair blocks in one tile of K.

    sums = pair_sums(K, ni, nj, nvir, e_i, e_j, e_vir, lower=True, i0=0, j0=0)   # (ni, nj, 2)
    os_ = pair_os(K, ni, nj, nvir, nvj, e_i, e_j, e_vir, e_vir_j)                  # (ni, nj)

K: a contiguous-rows torch tensor (ni*nvir, nj*nvj) of float64 or float32 (row stride K.stride(0));
orbital energies: float64 CPU tensors in Hartree. Results: float64 numpy arrays in Hartree; see the
C file for the sums. The call releases the GIL (ctypes), so one thread per tile runs in parallel.
"""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import torch

from .build import load

NAME = "pair_epilogue"
_P, _L, _D, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_double, ctypes.c_int


@functools.cache
def library() -> tuple[ctypes.CDLL, dict]:
    """The compiled library with its argument types set, and what was built (build.load)."""
    lib, info = load(NAME)
    for suffix in ("d", "f"):
        fn = getattr(lib, f"pair_sums_{suffix}")
        fn.argtypes, fn.restype = [_P, _L, _L, _L, _L, _P, _P, _P, _I, _L, _L, _P], None
        fn = getattr(lib, f"pair_os_{suffix}")
        fn.argtypes, fn.restype = [_P, _L, _L, _L, _L, _L, _P, _P, _P, _P, _P], None
    return lib, info


def _suffix(K: torch.Tensor) -> str:
    if K.dtype not in (torch.float64, torch.float32) or K.device.type != "cpu" or K.ndim != 2 or K.stride(1) != 1:
        raise ValueError(
            f"pair_epilogue: K must be a 2-D CPU float64/float32 tensor with unit column "
            f"stride, got {K.dtype} {tuple(K.shape)} strides {K.stride()} on {K.device}"
        )
    return "d" if K.dtype == torch.float64 else "f"


def _f64(x: torch.Tensor) -> torch.Tensor:
    if x.dtype != torch.float64 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError("pair_epilogue: orbital energies must be contiguous float64 CPU tensors")
    return x


def pair_sums(K, ni, nj, nvir, e_i, e_j, e_vir, *, lower=False, i0=0, j0=0) -> np.ndarray:  # noqa: PLR0913
    """(ni, nj, 2): [..., 0] = sum_ab K_ab^2 / D, [..., 1] = sum_ab K_ab K_ba / D per pair (i, j)
    of the tile, D = e_i + e_j - e_a - e_b (Hartree). ``lower``: pairs with i0 + i < j0 + j are
    not computed (left 0). K: (ni*nvir, nj*nvir)."""
    suffix = _suffix(K)
    if K.shape != (ni * nvir, nj * nvir) or e_i.shape != (ni,) or e_j.shape != (nj,) or e_vir.shape != (nvir,):
        raise ValueError(f"pair_sums: K {tuple(K.shape)} does not match ni={ni}, nj={nj}, nvir={nvir}")
    out = np.zeros((ni, nj, 2))
    getattr(library()[0], f"pair_sums_{suffix}")(
        K.data_ptr(),
        K.stride(0),
        ni,
        nj,
        nvir,
        _f64(e_i).data_ptr(),
        _f64(e_j).data_ptr(),
        _f64(e_vir).data_ptr(),
        int(lower),
        i0,
        j0,
        out.ctypes.data,
    )
    return out


def pair_os(K, ni, nj, nvir, nvj, e_i, e_j, e_vir, e_vir_j) -> np.ndarray:  # noqa: PLR0913
    """(ni, nj): sum_ab K_ab^2 / (e_i + e_j - e_a - e_b) per pair of opposite spins, a over e_vir
    (nvir,), b over e_vir_j (nvj,). K: (ni*nvir, nj*nvj)."""
    suffix = _suffix(K)
    if K.shape != (ni * nvir, nj * nvj) or e_vir.shape != (nvir,) or e_vir_j.shape != (nvj,):
        raise ValueError(f"pair_os: K {tuple(K.shape)} does not match ni={ni}, nj={nj}, nvir={nvir}, nvj={nvj}")
    out = np.zeros((ni, nj))
    getattr(library()[0], f"pair_os_{suffix}")(
        K.data_ptr(),
        K.stride(0),
        ni,
        nj,
        nvir,
        nvj,
        _f64(e_i).data_ptr(),
        _f64(e_j).data_ptr(),
        _f64(e_vir).data_ptr(),
        _f64(e_vir_j).data_ptr(),
        out.ctypes.data,
    )
    return out
