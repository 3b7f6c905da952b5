"""The CPU pair step by tiles: one BLAS GEMM per tile of occupied pairs on all of the BLAS's
threads, then the compiled epilogue (kernels/cpu/pair_epilogue.c) reads the tile's K once, its
rows shared among threads.

Paths on the CPU (``pair_kernel``, recorded in the backend's kernels; never switched silently):
  "gemm+epilogue"  this module: K for a tile of ic x jc pairs is ONE GEMM (ic*nvir, naux) @
                   (naux, jc*nvj), large enough to run near the BLAS's peak; the C epilogue then
                   forms K^2/D and K K^T/D from the tile, one occupied row i per call, the rows
                   spread over torch's thread count (ctypes releases the GIL).
  "gemm+torch"     linalg.torch_ops.mp2_pair_energy: one GEMM per row i and chunk of j, then
                   five to seven torch elementwise passes over K; needs no C compiler.
"auto" is gemm+epilogue (AUTO_RULE); a C kernel that cannot be built is an error (KernelError, at
backend creation), never a quiet switch to gemm+torch.

Why tiles: the pair step is nocc^2 nvir^2 naux flops in nvir x nvir GEMMs, too thin to reach a
CPU's peak alone, and torch's passes over K (its transpose through memory above all) cost a large
share of the GEMMs' time. Against the best square DGEMM of the same run, tiles with the C epilogue
came much closer to the peak than rows with torch's epilogue, and one tile at a time on all threads'
GEMM beat one tile per thread (the threads share the packed panels; larger tiles were slower). The
epilogue costs little next to the GEMMs (numbers, machine and date:
scripts/results/docstring-measurements.md).

Sums: every pair's OS and exchange sums are fp64 and formed in a fixed order (the C file), and the
pairs are combined by one numpy sum over the (ni, nj) array, so the energies do not depend on the
thread count or the tile shape given the same K.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .errors import KernelError

PAIR_PATHS = ("gemm+epilogue", "gemm+torch")
AUTO_RULE = (
    "gemm+epilogue: BLAS GEMM tiles + the compiled epilogue (one large GEMM per tile runs near the best "
    "DGEMM; gemm+torch's row GEMMs do not: scripts/results/pair_step_cpu.md)"
)
TILE_ELEMS = 1 << 22  # K elements of the one tile in flight (32 MB in fp64): GEMMs of m, n about
# 2048, the fastest against 8M and 16M elements and 4 x 4 tiles one a
# thread (GF/s: scripts/results/docstring-measurements.md)


def epilogue_info() -> dict:
    """Build (once) and load the C epilogue: what was built (kernels.cpu.build.load's record).
    Raises KernelError (one line, naming gemm+torch as what runs without a compiler)."""
    from dfmp2.kernels.cpu import build, pair_epilogue

    try:
        return pair_epilogue.library()[1]
    except build.KernelBuildError as e:
        raise KernelError(
            f"CPU pair kernel gemm+epilogue: {e}; or run the pair step with pair kernel "
            "gemm+torch (no compiler needed, slower)"
        ) from None


def choose(pair_kernel: str) -> tuple[str, str]:
    """(path, why) on the CPU for ``pair_kernel`` ('auto' or one of PAIR_PATHS); builds the C
    epilogue when the path needs it (KernelError when it cannot be built)."""
    if pair_kernel == "auto":
        path, why = "gemm+epilogue", f"auto: {AUTO_RULE}"
    elif pair_kernel in PAIR_PATHS:
        path, why = pair_kernel, f"user choice (--pair-kernel {pair_kernel})"
    else:
        raise ValueError(f"pair_kernel: expected auto or one of {PAIR_PATHS} on the cpu, got {pair_kernel!r}")
    if path == "gemm+epilogue":
        epilogue_info()
    return path, why


def tile_shape(ni: int, nj: int, nvir: int, nvj: int, symmetric: bool, tile_elems: int = TILE_ELEMS) -> tuple[int, int]:
    """(ic, jc): occupied orbitals per tile in i and j. The GEMM's m = ic*nvir and n = jc*nvj aim at
    sqrt(tile_elems) each (at least one pair), tiles are even, and square for a symmetric
    (diagonal) block."""
    side = math.isqrt(tile_elems)
    ic = max(1, min(ni, side // max(1, nvir)))
    jc = max(1, min(nj, tile_elems // max(1, ic * nvir * nvj)))
    if symmetric:
        ic = jc = min(ic, jc)
    even = lambda n, c: -(-n // -(-n // c))
    return even(ni, ic), even(nj, jc)


def tiles(ni: int, nj: int, ic: int, jc: int, symmetric: bool) -> list[tuple[int, int, int, int, bool]]:
    """[(i0, i1, j0, j1, by_rows)] row by row. Symmetric: the tiles with j0 <= i0 only, and a
    diagonal tile (j0 == i0) runs by rows (row i: one GEMM over j0..i), so no pair j > i is
    computed."""
    out = []
    for i0 in range(0, ni, ic):
        i1 = min(ni, i0 + ic)
        for j0 in range(0, i1 if symmetric else nj, jc):
            j1 = min(nj, j0 + jc)
            out.append((i0, i1, j0, j1, symmetric and j0 == i0))
    return out


def gemm_shape(tiles: bool, Bi, Bj, symmetric: bool) -> tuple[int, int] | None:
    """(rows, cols) of one pair-step GEMM: a tile's (ic*nvir, jc*nvj), or
    (``tiles`` False) gemm+torch's row (nvir, chunk of j * nvj); None for operands that are not
    (n, nvir, naux) or empty (the contract's checks say what is wrong)."""
    if Bi.ndim != 3 or Bj.ndim != 3 or Bi.shape[0] == 0 or Bj.shape[0] == 0:
        return None
    nvir, nvj = Bi.shape[1], Bj.shape[1]
    if not tiles:
        from .torch_ops import PAIR_CHUNK_ELEMS

        return nvir, min(Bj.shape[0], max(1, PAIR_CHUNK_ELEMS // max(1, nvir * nvj))) * nvj
    ic, jc = tile_shape(Bi.shape[0], Bj.shape[0], nvir, nvj, symmetric)
    return ic * nvir, jc * nvj


def tile_operands(Bi, Bj) -> tuple:
    """The first tile's GEMM operands, A (nvir, naux) and B (naux, nvj): views, as every tile's are,
    when Bi[i] and Bj[j] are (nvir, naux) with a unit stride in one dimension and rows i at a
    stride of nvir times that (Bt's view, or a contiguous B): what a BLAS reads without a copy."""
    return Bi[:1].reshape(-1, Bi.shape[2]), Bj[:1].reshape(-1, Bj.shape[2]).mT


def workspace_elems(ni: int, nj: int, nvir: int, nvj: int) -> int:
    """K elements held at a time: the one tile in flight (tile_shape's, at least one pair block)."""
    ic, jc = tile_shape(ni, nj, nvir, nvj, False)
    return ic * nvir * jc * nvj


def mp2_pair_energy(  # noqa: PLR0913
    Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, eps_vir_j=None, matmul=torch.matmul, tile_elems=None
):
    """MP2 opposite- and same-spin sums over all pairs (i, j) in I x J (the Backend contract):
    (e_os, e_ss) in Hartree, e_ss NaN when ``eps_vir_j`` is given (opposite spins).

    Bi (ni, nvir, naux), Bj (nj, nvj, naux) on the CPU in fp64 or fp32; every GEMM operand is a
    view (``tile_operands``) both for B stored as Bt (naux, nocc*nvir) (the pipeline's layout) and
    for a contiguous (n, nvir, naux) B (the benchmarks'). ``matmul(A, B)``: the tiles' GEMM on the
    BLAS's own threads (torch.matmul, or linalg.openblas.openblas_matmul); ``tile_elems``: K
    elements per tile (default TILE_ELEMS).
    """
    from dfmp2.kernels.cpu.pair_epilogue import pair_os, pair_sums

    from .torch_ops import check_pair_shapes

    ni, nvir, naux = Bi.shape
    nj, nvj = Bj.shape[0], Bj.shape[1]
    mixed = eps_vir_j is not None
    check_pair_shapes("mp2_pair_energy", Bi, Bj, symmetric, mixed)
    f64 = lambda e: e.to(device="cpu", dtype=torch.float64).contiguous()
    ei, ej, ev = f64(eps_i), f64(eps_j), f64(eps_vir)
    evj = f64(eps_vir_j) if mixed else ev
    sums = np.zeros((ni, nj) if mixed else (ni, nj, 2))
    if ni == 0 or nj == 0:
        return 0.0, (math.nan if mixed else 0.0)
    ic, jc = tile_shape(ni, nj, nvir, nvj, symmetric, tile_elems or TILE_ELEMS)

    def epilogue(K, r0, r1, j0, c1):  # rows r0..r1 of a K computed for (r0.., j0..c1)
        def row(i):
            Ki = K[(i - r0) * nvir : (i - r0 + 1) * nvir]
            if mixed:
                sums[i, j0:c1] = pair_os(Ki, 1, c1 - j0, nvir, nvj, ei[i : i + 1], ej[j0:c1], ev, evj)[0]
            else:
                sums[i, j0:c1] = pair_sums(Ki, 1, c1 - j0, nvir, ei[i : i + 1], ej[j0:c1], ev)[0]

        return row

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, torch.get_num_threads())) as pool:
        for i0, i1, j0, j1, by_rows in tiles(ni, nj, ic, jc, symmetric):
            for r0, r1, c1 in [(i, i + 1, i + 1) for i in range(i0, i1)] if by_rows else [(i0, i1, j1)]:
                K = matmul(Bi[r0:r1].reshape(-1, naux), Bj[j0:c1].reshape(-1, naux).mT)  # views: tile_operands
                list(pool.map(epilogue(K, r0, r1, j0, c1), range(r0, r1)))
    if mixed:
        return float(sums.sum()), math.nan
    w = np.ones((ni, nj))
    if symmetric:
        w = np.tril(np.full((ni, nj), 2.0), -1) + np.eye(ni, nj)
    e_os = float((w * sums[..., 0]).sum())
    return e_os, float((w * (sums[..., 0] - sums[..., 1])).sum())
