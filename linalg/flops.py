"""Flop counts of the linalg ops, from the shapes of one call (what ``linalg.ops`` charges to the
backend that ran it, ``Backend.count_flops``; stages read the totals through ``dfmp2.timing.Timer``).

A flop is one floating-point addition or multiplication, whatever the precision. The counts are
the standard ones of each op's contract (LAPACK's operation counts), not what a kernel executes
inside: a blocked or padded kernel (the blocked-triangle SYRK, Trainium's padded tiles) does a
little more, and is charged the contract's count all the same, so that GF/s compares kernels on
the same work.

    gemm      op(a) (m, k), op(b) (k, n)        2 m n k            (per batch matrix; alpha, beta free)
    syrk      a a^T, a (n, k)                   n (n + 1) k        (one triangle, as BLAS DSYRK)
    trsm      (n, n) triangle, m right sides    m n^2
    cholesky  (n, n)                            n^3 / 3
    eigh      (n, n), values and vectors        10/3 n^3           (Householder reduction to
              tridiagonal, 4/3 n^3, and the back-transformation of the vectors, 2 n^3; the
              tridiagonal solve, data-dependent and O(n^2) to O(n^3), is not counted: a lower bound)
    inv_sqrt_spd  eigh: 10/3 n^3 + 2 n^2 kept  (the eigendecomposition, then V diag V^T)
                  newton_schulz: 6 n^3 per iteration (three GEMMs) + 4 n^3 (the residual's two)
    mp2_pair_energy  2 nvir nvir_j naux per pair (i, j) the call computes: ni (ni + 1) / 2 pairs on
              a diagonal block (symmetric), ni nj otherwise; the GEMM of K_ij only: the epilogue
              (the division by D and the sums, about 6 flops per element of K) is O(nvir^2) per pair
              against the GEMM's O(nvir^2 naux), and is not counted

Elementwise work outside the ops (J's packing, adding Fock matrices) is not counted anywhere.
"""

from __future__ import annotations

import math


def _batch(shape) -> int:
    """Matrices in a batch of shape (..., r, c): the product of the leading dimensions."""
    return math.prod(shape[:-2]) if len(shape) > 2 else 1


def gemm(a_shape, b_shape, trans_a: bool = False, trans_b: bool = False) -> int:
    """2 m n k per matrix of the (broadcast) batch: op(a) (..., m, k), op(b) (..., k, n)."""
    m, k = (a_shape[-1], a_shape[-2]) if trans_a else (a_shape[-2], a_shape[-1])
    n = b_shape[-2] if trans_b else b_shape[-1]
    return 2 * m * n * k * max(_batch(a_shape), _batch(b_shape))


def syrk(a_shape, trans: bool = False) -> int:
    """n (n + 1) k: a a^T of a (n, k), or a^T a of a (k, n) when ``trans``."""
    n, k = (a_shape[-1], a_shape[-2]) if trans else (a_shape[-2], a_shape[-1])
    return n * (n + 1) * k


def trsm(a_shape, b_numel: int) -> int:
    """m n^2 for an (n, n) triangle and b of m n elements (m right-hand sides, either side)."""
    return a_shape[-1] * b_numel


def cholesky(a_shape) -> int:
    """n^3 / 3 per (n, n) matrix (rounded down)."""
    n = a_shape[-1]
    return _batch(a_shape) * (n**3 // 3)


def eigh(a_shape) -> int:
    """10/3 n^3 per (n, n) matrix (rounded down; see the module docstring)."""
    n = a_shape[-1]
    return _batch(a_shape) * (10 * n**3 // 3)


def inv_sqrt_spd(a_shape, info: dict) -> int:
    """A call's count from the ``info`` it returned: 'eigh' (eigh + 2 n^2 kept) or
    'newton_schulz' (6 n^3 per iteration + 4 n^3 for the residual, when it was computed)."""
    n = a_shape[-1]
    if info.get("method") == "newton_schulz":
        residual = 4 * n**3 if math.isfinite(info.get("residual", math.inf)) else 0
        return 6 * n**3 * int(info.get("iterations", 0)) + residual
    return eigh(a_shape) + 2 * n * n * int(info.get("kept", n))


def mp2_pair_energy(bi_shape, bj_shape, symmetric: bool) -> int:
    """2 nvir nvir_j naux per pair: Bi (ni, nvir, naux), Bj (nj, nvir_j, naux); ni (ni + 1) / 2
    pairs when ``symmetric`` (Bj is Bi), else ni nj."""
    ni, nvir, naux = bi_shape
    nj, nvj = bj_shape[0], bj_shape[1]
    pairs = ni * (ni + 1) // 2 if symmetric else ni * nj
    return 2 * nvir * nvj * naux * pairs
