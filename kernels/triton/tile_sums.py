"""The OS/SS reduction over one K tile pair, shared by both pair-step kernels (fused_pair_energy
and pair_energy_epilogue): one ``@triton.jit`` helper, inlined by Triton into each kernel.

With X = K[A, B] and Y = K[B, A]^T element-aligned (fp64), D = e_i + e_j - e_a - e_b:
  A < B (DIAG False): OS = sum (X^2 + Y^2)/D,  SS = sum (X - Y)^2/D   (the tile and its mirror)
  A = B (DIAG True):  OS = sum X^2/D,          SS = OS - sum Y X/D with Y = X^T
Padding (a or b >= nvir) has X = Y = 0 and D set to 1, so it adds nothing.

Like the kernels, the helper is jitted when a kernel is first built, not at import (Triton fixes
at its own import whether the process interprets); ``jit_kernel`` puts it, jitted for the same
setting, into the kernel module's globals, where Triton looks the callee up; it also keeps the
jitted kernels, one per function and setting.
"""

from __future__ import annotations

import triton
import triton.language as tl


def _pair_tile_sums(x, y, eij, eps_vir_ptr, offs_a, offs_b, mask_a, mask_b, DIAG: tl.constexpr):
    """(e_os, e_ss) fp64 of one tile pair. x, y: (BLOCK, BLOCK) fp64; eij = e_i + e_j (Hartree);
    offs_a, offs_b: virtual indices of the tile's rows and columns; mask_*: those < nvir."""
    ea = tl.load(eps_vir_ptr + offs_a, mask=mask_a, other=0.0)
    eb = tl.load(eps_vir_ptr + offs_b, mask=mask_b, other=0.0)
    d = eij - (ea[:, None] + eb[None, :])
    d = tl.where(mask_a[:, None] & mask_b[None, :], d, 1.0)  # padding: X = Y = 0 there
    xd = x / d
    if DIAG:
        e_os = tl.sum(tl.sum(x * xd, axis=1), axis=0)
        e_ss = e_os - tl.sum(tl.sum(y * xd, axis=1), axis=0)
    else:
        yd = y / d
        e_os = tl.sum(tl.sum(x * xd + y * yd, axis=1), axis=0)
        e_ss = tl.sum(tl.sum((x - y) * (xd - yd), axis=1), axis=0)
    return e_os, e_ss


_JIT = {}  # (python function, interpreting) -> its triton.jit


def jit_kernel(pyfn):
    """triton.jit of a kernel function that calls ``pair_tile_sums``, built once per interpreter
    setting, with the helper jitted for the same setting and bound in the kernel's module globals."""
    from .launch import interpreting

    interp = interpreting()
    if (pyfn, interp) not in _JIT:
        if (_pair_tile_sums, interp) not in _JIT:
            _JIT[_pair_tile_sums, interp] = triton.jit(_pair_tile_sums)
        pyfn.__globals__["pair_tile_sums"] = _JIT[_pair_tile_sums, interp]
        _JIT[pyfn, interp] = triton.jit(pyfn)
    return _JIT[pyfn, interp]
