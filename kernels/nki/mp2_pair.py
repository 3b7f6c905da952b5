"""Fused NKI MP2 pair-energy kernel: K = B_i B_j^T tile by tile on chip, divided by the
denominators and reduced, without writing any nvir x nvir block back to HBM.

For a pair (i, j), with K_ab = sum_P B_ia^P B_jb^P and D_ab = e_i + e_j - e_a - e_b:

    OS_ij = sum_ab K_ab^2 / D_ab,      X_ij = sum_ab K_ab K_ba / D_ab,      SS_ij = OS_ij - X_ij

Tiles of K are 128 rows (a, on partitions) x up to 512 columns (b, one PSUM bank). Row
block A only visits columns b >= start of A. Each visited tile is formed twice on the
Tensor Engine, with the operands' roles swapped:

    M1[a, b] = sum_P B_ia^P B_jb^P = K_ab        M2[a, b] = sum_P B_ja^P B_ib^P = K_ba

so both the (a, b) tile and the transposed (b, a) tile sit element-aligned in PSUM. A tile
strictly right of the diagonal block stands for itself and its mirror:
OS += sum (M1^2 + M2^2)/D, X += 2 sum M1 M2 / D. On the diagonal block (columns of A
itself) M2 is the transpose of M1 and OS += sum M1^2/D, X += sum M1 M2/D. The matmul work
is therefore K's own flops plus one extra diagonal block per row block, about
(1 + 128/nvir) x nvir^2 naux per pair.

Opposite spins (``opposite=True``, UMP2's alpha-beta block): B_j has its own virtuals (nvir_j
columns, e_vir_rows over them), K is rectangular and has no mirror, so every tile (A, B) over
all b is formed once (M1 only) and only OS = sum_ab K_ab^2 / D is summed (the X column stays 0).

Per-partition partial sums are accumulated in SBUF (fp32, each a sum over <= nvir terms)
and written out once; the host adds partitions and pairs in fp64.

NKI constructs and the reference pages they follow: nl.ndarray with buffer=nl.sbuf / nl.psum /
nl.shared_hbm and views by slicing (NKI Language Guide, "Tensor Values", "Tensor Indexing");
nisa.dma_copy (HBM <-> SBUF); nisa.nc_matmul with accumulate=(k > 0) (nki.isa.nc_matmul,
"Accumulation mode"); nisa.tensor_scalar with a (P, 1) tile operand and reverse0
(nki.isa.tensor_scalar); nisa.reciprocal (Vector Engine, fp32); nisa.tensor_tensor with at
most one PSUM input (nki.isa.tensor_tensor); nisa.tensor_reduce over the free axis
(nki.isa.tensor_reduce); nisa.memset; loops are Python range, unrolled at specialisation
(NKI Language Guide, "Compilation Model"; nl.affine_range is a deprecated alias of range).
"""

from .lang import nisa, nl

TILE_P = 128  # aux (contraction) rows per matmul: nl.tile_size.pmax
TILE_A = 128  # virtual rows a per K tile: nl.tile_size.gemm_stationary_fmax
TILE_B = 512  # virtual columns b per K tile: nl.tile_size.gemm_moving_fmax (one fp32 PSUM bank)


def mp2_pair_kernel(biT, bjT, e_i_rows, e_j_rows, e_vir_col, e_vir_rows, symmetric=False, opposite=False):
    """biT: HBM (ni, naux, nvir) fp32 = B_i with the aux index before the virtual one;
    bjT: HBM (nj, naux, nvir) fp32 likewise (the same array as biT when symmetric);
    e_i_rows: HBM (128, ni) fp32, occupied energies of I repeated on every partition;
    e_j_rows: HBM (128, nj) fp32, the same for J;
    e_vir_col: HBM (nvir, 1) fp32, virtual energies one per partition;
    e_vir_rows: HBM (128, nvir) fp32, virtual energies repeated on every partition;
    symmetric: compile-time flag, I == J: only pairs i >= j are computed (others stay 0).
    opposite: compile-time flag, i and j of opposite spins: bjT is (nj, naux, nvir_j) and
    e_vir_rows (128, nvir_j) hold j's virtuals; only OS is summed (X stays 0).
    Energies in Hartree. Returns HBM (128, 2 ni nj) fp32: column 2(i nj + j) holds the
    per-partition partial sums of OS_ij, column 2(i nj + j) + 1 those of X_ij."""
    ni, naux, nvir = biT.shape
    nj, nvir_j = bjT.shape[0], bjT.shape[2]
    assert opposite or nvir_j == nvir
    assert not (opposite and symmetric)
    assert TILE_P <= nl.tile_size.pmax and TILE_A <= nl.tile_size.gemm_stationary_fmax
    assert TILE_B <= nl.tile_size.gemm_moving_fmax
    npart = TILE_P
    nk = (naux + TILE_P - 1) // TILE_P

    out = nl.ndarray((npart, 2 * ni * nj), dtype=nl.float32, buffer=nl.shared_hbm)
    acc = nl.ndarray((npart, 2 * ni * nj), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=acc, value=0.0)
    e_i, e_j, e_b, e_a = _load_energies(e_i_rows, e_j_rows, e_vir_col, e_vir_rows, ni, nj, nvir, nvir_j)
    bi, bj = _aux_chunks(naux, nvir, nvir_j)
    work = _work_tiles()

    for i in range(ni):
        _load_aux_chunks(bi, biT, i)
        j_end = i + 1 if symmetric else nj
        for j in range(j_end):
            _load_aux_chunks(bj, bjT, j)
            c_os = 2 * (i * nj + j)
            for ab in range(len(e_a)):
                _row_block(
                    acc, work, bi, bj, e_i, e_j, e_a[ab], e_b, i, j, ab * TILE_A, nvir, nvir_j, nk, c_os, opposite
                )
    nisa.dma_copy(dst=out, src=acc)
    return out


# Helpers of mp2_pair_kernel. They reach NKI only through the module globals nl and nisa, as the
# kernel does (the NumPy emulator re-binds them for the kernel's module functions alike).


def _load_energies(e_i_rows, e_j_rows, e_vir_col, e_vir_rows, ni, nj, nvir, nvir_j):
    """The orbital energies in SBUF, loaded once per launch: e_i (128, ni), e_j (128, nj) and
    e_b (128, nvir_j) repeated on every partition, and e_a, one (<= 128, 1) column per row block."""
    npart = TILE_P
    e_i = nl.ndarray((npart, ni), dtype=nl.float32, buffer=nl.sbuf)
    e_j = nl.ndarray((npart, nj), dtype=nl.float32, buffer=nl.sbuf)
    e_b = nl.ndarray((npart, nvir_j), dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=e_i, src=e_i_rows)
    nisa.dma_copy(dst=e_j, src=e_j_rows)
    nisa.dma_copy(dst=e_b, src=e_vir_rows)
    e_a = []
    for a0 in range(0, nvir, TILE_A):
        at = min(TILE_A, nvir - a0)
        t = nl.ndarray((at, 1), dtype=nl.float32, buffer=nl.sbuf)
        nisa.dma_copy(dst=t, src=e_vir_col[a0 : a0 + at, :])
        e_a.append(t)
    return e_i, e_j, e_b, e_a


def _aux_chunks(naux, nvir, nvir_j):
    """SBUF homes of B_i and B_j as aux chunks (aux on partitions, all virtuals free)."""
    bi = []
    bj = []
    for k0 in range(0, naux, TILE_P):
        kt = min(TILE_P, naux - k0)
        bi.append(nl.ndarray((kt, nvir), dtype=nl.float32, buffer=nl.sbuf))
        bj.append(nl.ndarray((kt, nvir_j), dtype=nl.float32, buffer=nl.sbuf))
    return bi, bj


def _load_aux_chunks(chunks, bT, i):
    """B of occupied orbital i (HBM bT[i], (naux, nvir)) into its SBUF aux chunks."""
    for k in range(len(chunks)):
        k0 = k * TILE_P
        nisa.dma_copy(dst=chunks[k], src=bT[i, k0 : k0 + chunks[k].shape[0], :])


def _work_tiles():
    """Work tiles, allocated once at full tile size and used through views: M1 and M2 (PSUM),
    1/D, M1/D and a product (SBUF), the row constant e_i + e_j - e_a and a partial sum."""
    m1 = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.psum)
    m2 = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.psum)
    rden = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)  # 1 / D
    kd = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)  # M1 / D
    prod = nl.ndarray((TILE_A, TILE_B), dtype=nl.float32, buffer=nl.sbuf)
    row_c = nl.ndarray((TILE_A, 1), dtype=nl.float32, buffer=nl.sbuf)  # e_i + e_j - e_a
    part = nl.ndarray((TILE_A, 1), dtype=nl.float32, buffer=nl.sbuf)
    return m1, m2, rden, kd, prod, row_c, part


def _add_column(acc, c, at, pt):
    """acc[:at, c] += pt (one pair's per-partition partial sums)."""
    nisa.tensor_tensor(dst=acc[0:at, c : c + 1], data1=acc[0:at, c : c + 1], data2=pt, op=nl.add)


def _row_block(acc, work, bi, bj, e_i, e_j, e_a, e_b, i, j, a0, nvir, nvir_j, nk, c_os, opposite):  # noqa: PLR0913
    """Pair (i, j)'s sums over row block A (virtuals a0 .. a0 + at) and its column tiles
    (e_a: the block's (at, 1) virtual energies)."""
    _, _, _, _, _, row_c, part = work
    at = min(TILE_A, nvir - a0)
    rc = row_c[0:at, :]
    pt = part[0:at, :]
    nisa.tensor_tensor(dst=rc, data1=e_i[0:at, i : i + 1], data2=e_j[0:at, j : j + 1], op=nl.add)
    nisa.tensor_tensor(dst=rc, data1=rc, data2=e_a, op=nl.subtract)
    for b0 in range(0 if opposite else a0, nvir_j, TILE_B):
        bt = min(TILE_B, nvir_j - b0)
        r, q = _os_tile(acc, work, bi, bj, e_b, rc, pt, a0, at, b0, bt, nk, c_os)
        if opposite:  # no mirror tile M2, no exchange term
            continue
        _x_tile(acc, work, bi, bj, r, q, pt, a0, at, b0, bt, nk, c_os)


def _os_tile(acc, work, bi, bj, e_b, rc, pt, a0, at, b0, bt, nk, c_os):  # noqa: PLR0913
    """Tile (A, b0 .. b0 + bt): M1 = K_ab, 1/D, M1/D, and OS += sum_b M1^2 / D.
    Returns the views 1/D and M1/D for the exchange term."""
    m1, _, rden, kd, prod, _, _ = work
    t1 = m1[0:at, 0:bt]
    for k in range(nk):
        nisa.nc_matmul(dst=t1, stationary=bi[k][:, a0 : a0 + at], moving=bj[k][:, b0 : b0 + bt], accumulate=(k > 0))
    r = rden[0:at, 0:bt]
    q = kd[0:at, 0:bt]
    p = prod[0:at, 0:bt]
    # D = (e_i + e_j - e_a) - e_b, then 1/D on the Vector Engine.
    nisa.tensor_scalar(dst=r, data=e_b[0:at, b0 : b0 + bt], op0=nl.subtract, operand0=rc, reverse0=True)
    nisa.reciprocal(dst=r, data=r)
    nisa.tensor_tensor(dst=q, data1=t1, data2=r, op=nl.multiply)
    # OS += sum_b M1^2 / D
    nisa.tensor_tensor(dst=p, data1=q, data2=t1, op=nl.multiply)
    nisa.tensor_reduce(dst=pt, op=nl.add, data=p, axis=1, keepdims=True)
    _add_column(acc, c_os, at, pt)
    return r, q


def _x_tile(acc, work, bi, bj, r, q, pt, a0, at, b0, bt, nk, c_os):  # noqa: PLR0913
    """The mirror tile M2 = K_ba of tile (A, b0 .. b0 + bt), X += sum_b M1 M2 / D, and, for the
    columns right of the diagonal block (which also stand for their mirror tile), OS and X again."""
    _, m2, _, _, prod, _, _ = work
    c_x = c_os + 1
    t2 = m2[0:at, 0:bt]
    p = prod[0:at, 0:bt]
    for k in range(nk):
        nisa.nc_matmul(dst=t2, stationary=bj[k][:, a0 : a0 + at], moving=bi[k][:, b0 : b0 + bt], accumulate=(k > 0))
    # X += sum_b M1 M2 / D
    nisa.tensor_tensor(dst=p, data1=q, data2=t2, op=nl.multiply)
    nisa.tensor_reduce(dst=pt, op=nl.add, data=p, axis=1, keepdims=True)
    _add_column(acc, c_x, at, pt)
    # Columns right of the diagonal block also stand for their mirror tile.
    d = at if b0 == a0 else 0
    if d < bt:
        po = prod[0:at, d:bt]
        nisa.tensor_tensor(dst=po, data1=q[:, d:bt], data2=t2[:, d:bt], op=nl.multiply)
        nisa.tensor_reduce(dst=pt, op=nl.add, data=po, axis=1, keepdims=True)
        _add_column(acc, c_x, at, pt)
        nisa.tensor_tensor(dst=po, data1=t2[:, d:bt], data2=r[:, d:bt], op=nl.multiply)
        nisa.tensor_tensor(dst=po, data1=po, data2=t2[:, d:bt], op=nl.multiply)
        nisa.tensor_reduce(dst=pt, op=nl.add, data=po, axis=1, keepdims=True)
        _add_column(acc, c_os, at, pt)


def sbuf_bytes_per_partition(ni: int, nj: int, naux: int, nvir: int, nvir_j: int | None = None) -> int:
    """SBUF the kernel keeps live per partition (fp32), for choosing launch sizes on the host
    (``nvir_j``: j's virtuals when the spins differ, default nvir)."""
    nvir_j = nvir if nvir_j is None else nvir_j
    nk = (naux + TILE_P - 1) // TILE_P
    na = (nvir + TILE_A - 1) // TILE_A
    words = 2 * ni * nj + ni + nj + nvir_j + na + nk * (nvir + nvir_j) + 3 * TILE_B + 2
    return 4 * words
