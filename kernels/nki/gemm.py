"""NKI GEMM: out = lhsT.T @ rhs, fp32 inputs, fp32 accumulation in PSUM.

Tiling follows the NKI matrix-multiplication tutorial (nki/guides/tutorials/
matrix_multiplication): the contraction dim K lies on the SBUF partitions; a stationary
tile is at most 128 (K) x 128 (M), a moving tile at most 128 (K) x 512 (N), and the
(M, N) result tile accumulates over the K tiles in one PSUM bank
(nki.isa.nc_matmul, "Tile size" and "Accumulation mode"). Shapes that are not multiples
of the tile sizes get narrower edge tiles, so no padding is needed inside the kernel;
the backend pads to bucketed shapes only to bound the number of compiled kernels.
"""

from .lang import nisa, nl

TILE_K = 128  # partitions: nl.tile_size.pmax
TILE_M = 128  # stationary free size: nl.tile_size.gemm_stationary_fmax
TILE_N = 512  # moving free size: nl.tile_size.gemm_moving_fmax (= one fp32 PSUM bank)


def gemm_kernel(lhsT, rhs):
    """lhsT: HBM (K, M) fp32, the left operand transposed; rhs: HBM (K, N) fp32.
    Returns HBM (M, N) fp32 = lhsT.T @ rhs."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    assert K == K_, "lhsT and rhs must share the contraction dim"
    assert TILE_K <= nl.tile_size.pmax and TILE_M <= nl.tile_size.gemm_stationary_fmax
    assert TILE_N <= nl.tile_size.gemm_moving_fmax

    out = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for m0 in range(0, M, TILE_M):
        mt = min(TILE_M, M - m0)
        for n0 in range(0, N, TILE_N):
            nt = min(TILE_N, N - n0)
            acc = nl.ndarray((mt, nt), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, K, TILE_K):
                kt = min(TILE_K, K - k0)
                a = nl.ndarray((kt, mt), dtype=nl.float32, buffer=nl.sbuf)
                b = nl.ndarray((kt, nt), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k0 : k0 + kt, m0 : m0 + mt])
                nisa.dma_copy(dst=b, src=rhs[k0 : k0 + kt, n0 : n0 + nt])
                # The first K tile overwrites the PSUM tile, the rest accumulate onto it.
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=(k0 > 0))
            res = nl.ndarray((mt, nt), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)  # PSUM -> SBUF; DMA cannot read PSUM
            nisa.dma_copy(dst=out[m0 : m0 + mt, n0 : n0 + nt], src=res)
    return out
