"""What both pair-step kernels (fused_pair_energy and pair_energy_epilogue) share, as
``@triton.jit`` helpers that Triton inlines into each kernel: the prologue that reads a program's
pair (i, j) and tile pair (A, B) and forms the tile's virtual indices (``tile_prologue``), and the
OS/SS reduction over one K tile pair (``pair_tile_sums``).

A program owns grid cell (tile pair, pair): axis 0 indexes the tile pairs, axis 1 the pairs, and
the program's fp64 partials sit at pair * ntile_pairs + tile in the (npairs, ntile_pairs) buffers.

With X = K[A, B] and Y = K[B, A]^T element-aligned (fp64), D = e_i + e_j - e_a - e_b:
  A < B (DIAG False): OS = sum (X^2 + Y^2)/D,  SS = sum (X - Y)^2/D   (the tile and its mirror)
  A = B (DIAG True):  OS = sum X^2/D,          SS = OS - sum Y X/D with Y = X^T
Padding (a or b >= nvir) has X = Y = 0 and D set to 1, so it adds nothing.

Like the kernels, the helpers are jitted when a kernel is first built, not at import (Triton
fixes at its own import whether the process interprets); ``jit_kernel`` puts them, jitted for the
same setting, into the kernel module's globals, where Triton looks a callee up; it also keeps the
jitted kernels, one per function and setting.
"""

from __future__ import annotations

import triton
import triton.language as tl


def _tile_prologue(pair_i_ptr, pair_j_ptr, tile_a_ptr, tile_b_ptr, nvir, nvir_b, ntile_pairs, BLOCK: tl.constexpr):
    """(i, j, offs_a, offs_b, mask_a, mask_b, out) of this program: its occupied pair (i, j) and
    tile pair (A, B) read from the int64 index lists at its grid cell; offs_a, offs_b: int64
    virtual indices of the tile's rows (A) and columns (B); mask_*: those < nvir (rows) and
    < nvir_b (columns); out: the program's element of the partial-sum buffers."""
    pid_tile = tl.program_id(0)
    pid_pair = tl.program_id(1)
    i = tl.load(pair_i_ptr + pid_pair)
    j = tl.load(pair_j_ptr + pid_pair)
    ta = tl.load(tile_a_ptr + pid_tile)
    tb = tl.load(tile_b_ptr + pid_tile)
    offs = tl.arange(0, BLOCK).to(tl.int64)
    offs_a = ta * BLOCK + offs
    offs_b = tb * BLOCK + offs
    mask_a = offs_a < nvir
    mask_b = offs_b < nvir_b
    out = pid_pair.to(tl.int64) * ntile_pairs + pid_tile
    return i, j, offs_a, offs_b, mask_a, mask_b, out


def _pair_tile_sums(x, y, eij, eps_vir_ptr, offs_a, offs_b, mask_a, mask_b, DIAG: tl.constexpr):  # noqa: PLR0913
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


_HELPERS = {"tile_prologue": _tile_prologue, "pair_tile_sums": _pair_tile_sums}  # name in the kernels
_JIT = {}  # (python function, interpreting) -> its triton.jit


def jit_kernel(pyfn):
    """triton.jit of a kernel function that calls the helpers (``tile_prologue``,
    ``pair_tile_sums``), built once per interpreter setting, with the helpers jitted for the same
    setting and bound in the kernel's module globals."""
    from .launch import interpreting

    interp = interpreting()
    if (pyfn, interp) not in _JIT:
        for name, helper in _HELPERS.items():
            if (helper, interp) not in _JIT:
                _JIT[helper, interp] = triton.jit(helper)
            pyfn.__globals__[name] = _JIT[helper, interp]
        _JIT[pyfn, interp] = triton.jit(pyfn)
    return _JIT[pyfn, interp]
