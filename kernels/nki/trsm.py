"""NKI TRSM: solve L X = B for lower-triangular L by blocked forward substitution.

With 128-row blocks k and the inverses of L's diagonal blocks prepared once per matrix
(on the host, in fp64), every step is a matrix product on the Tensor Engine:

    X_k = Dinv_k (B_k - sum_{j<k} L_kj X_j)

The right-hand sides are processed in column chunks of up to 512 (one PSUM bank); the
solved row blocks of a chunk stay in SBUF as the moving operands of later blocks, so SBUF
holds ceil(n/128) x 512 fp32 per partition for them (2 KiB per block: n up to several
thousand fits). Every side/uplo/trans case maps onto this one form on the host
(transposes and index reversal), so one kernel serves all of them.

NKI constructs: nl.ndarray (sbuf / psum / shared_hbm), nisa.dma_copy, nisa.nc_matmul with
accumulate (nki.isa.nc_matmul), nisa.tensor_tensor(op=nl.subtract) with one PSUM input
(nki.isa.tensor_tensor), nisa.tensor_copy PSUM -> SBUF (nki.isa.tensor_copy), Python lists
of tiles (NKI Language Guide, "NKI Values").
"""

from .lang import nisa, nl

TILE = 128  # row block = partitions (nl.tile_size.pmax) = stationary free size (gemm_stationary_fmax)
TILE_N = 512  # right-hand-side columns per chunk: nl.tile_size.gemm_moving_fmax


def trsm_lower_kernel(lT, dinvT, b):
    """lT: HBM (n, n) fp32, L transposed (L lower-triangular);
    dinvT: HBM (nblk, 128, 128) fp32, block k holds (L_kk^-1)^T in its leading corner
           (nblk = ceil(n / 128); the last block may be partial);
    b: HBM (n, m) fp32.  Returns HBM (n, m) fp32 X with L X = b."""
    n, m = b.shape
    nblk = dinvT.shape[0]
    assert lT.shape == (n, n) and nblk * TILE >= n
    assert TILE <= nl.tile_size.pmax and TILE <= nl.tile_size.gemm_stationary_fmax
    assert TILE_N <= nl.tile_size.gemm_moving_fmax

    x = nl.ndarray((n, m), dtype=nl.float32, buffer=nl.shared_hbm)
    for c0 in range(0, m, TILE_N):
        ct = min(TILE_N, m - c0)
        solved = []  # X row blocks of this chunk, kept in SBUF
        for kb in range(nblk):
            k0 = kb * TILE
            kt = min(TILE, n - k0)
            rhs = nl.ndarray((kt, ct), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=rhs, src=b[k0 : k0 + kt, c0 : c0 + ct])
            if kb > 0:
                # sum_{j<k} L_kj X_j: stationary (L_kj)^T = lT[j, k] block, moving X_j.
                acc = nl.ndarray((kt, ct), dtype=nl.float32, buffer=nl.psum)
                for jb in range(kb):
                    j0 = jb * TILE
                    jt = min(TILE, n - j0)
                    l_kj = nl.ndarray((jt, kt), dtype=nl.float32, buffer=nl.sbuf)
                    nisa.dma_copy(dst=l_kj, src=lT[j0 : j0 + jt, k0 : k0 + kt])
                    nisa.nc_matmul(dst=acc, stationary=l_kj, moving=solved[jb], accumulate=(jb > 0))
                nisa.tensor_tensor(dst=rhs, data1=rhs, data2=acc, op=nl.subtract)
            d_k = nl.ndarray((kt, kt), dtype=nl.float32, buffer=nl.sbuf)
            nisa.dma_copy(dst=d_k, src=dinvT[kb, 0:kt, 0:kt])
            xk_psum = nl.ndarray((kt, ct), dtype=nl.float32, buffer=nl.psum)
            nisa.nc_matmul(dst=xk_psum, stationary=d_k, moving=rhs, accumulate=False)
            xk = nl.ndarray((kt, ct), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=xk, src=xk_psum)
            nisa.dma_copy(dst=x[k0 : k0 + kt, c0 : c0 + ct], src=xk)
            solved.append(xk)
    return x
