"""NKI SYRK: the lower-triangular tile blocks of C = A @ A.T, fp32, PSUM accumulation.

For each 128-row block I of C only the columns up to and including the diagonal block
are computed (in moving tiles of up to 512 columns), so the work is about half a GEMM.
The diagonal tiles are computed whole (both triangles); the strictly-upper tile blocks
of the output are never written (HBM is uninitialised there: nki.simulate fills it with
NaN) and the host mirrors or masks the lower blocks.

NKI constructs: as kernels/nki/gemm.py (nl.ndarray, nisa.dma_copy, nisa.nc_matmul with
accumulate, nisa.tensor_copy PSUM -> SBUF).
"""

from .lang import nisa, nl

TILE_K = 128  # partitions: nl.tile_size.pmax
TILE_M = 128  # stationary free size: nl.tile_size.gemm_stationary_fmax
TILE_N = 512  # moving free size: nl.tile_size.gemm_moving_fmax


def syrk_lower_kernel(aT):
    """aT: HBM (K, N) fp32, A transposed (A is (N, K)). Returns HBM (N, N) fp32 whose
    tile blocks on and below the 128-block diagonal hold A @ A.T; blocks above are unwritten."""
    K, N = aT.shape
    assert TILE_K <= nl.tile_size.pmax and TILE_M <= nl.tile_size.gemm_stationary_fmax
    assert TILE_N <= nl.tile_size.gemm_moving_fmax

    out = nl.ndarray((N, N), dtype=nl.float32, buffer=nl.shared_hbm)
    for i0 in range(0, N, TILE_M):
        it = min(TILE_M, N - i0)
        c_end = i0 + it  # last column of the diagonal block
        for c0 in range(0, c_end, TILE_N):
            ct = min(TILE_N, c_end - c0)
            acc = nl.ndarray((it, ct), dtype=nl.float32, buffer=nl.psum)
            for k0 in range(0, K, TILE_K):
                kt = min(TILE_K, K - k0)
                a = nl.ndarray((kt, it), dtype=nl.float32, buffer=nl.sbuf)
                b = nl.ndarray((kt, ct), dtype=nl.float32, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=aT[k0 : k0 + kt, i0 : i0 + it])
                nisa.dma_copy(dst=b, src=aT[k0 : k0 + kt, c0 : c0 + ct])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=(k0 > 0))
            res = nl.ndarray((it, ct), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=out[i0 : i0 + it, c0 : c0 + ct], src=res)
    return out
