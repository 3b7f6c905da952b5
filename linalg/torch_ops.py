"""Torch implementations of the linalg ops (CPU and CUDA). TorchBackend delegates here.

Each function states shapes; all take and return torch tensors on one device. Argument
checks raise ValueError with one line naming the op, the argument and the shapes.
"""

from __future__ import annotations

import contextlib
import math

import torch

from .errors import NotPositiveDefiniteError

PAIR_CHUNK_ELEMS = 1 << 20  # mp2_pair_energy: K elements per chunk (dfmp2.memory plans with it)
SYRK_MIN_BLOCK = 128  # below 2 blocks of this, a single GEMM is faster than the triangle
SYRK_MAX_BLOCKS = 8  # 8 block rows: (8 + 1) / 16 = 56% of the full GEMM's flops
SYRK_MIN_K = 128  # below this the GEMM is memory-bound: halving flops does not pay
# (on a CPU, 1 thread, blocked was slower at small k and faster at
#  large k: scripts/results/docstring-measurements.md)


def _check_side_uplo(op: str, side: str | None, uplo: str) -> None:
    if side is not None and side not in ("left", "right"):
        raise ValueError(f"{op}: side must be 'left' or 'right', got {side!r}")
    if uplo not in ("lower", "upper"):
        raise ValueError(f"{op}: uplo must be 'lower' or 'upper', got {uplo!r}")


def _check_square(op: str, a: torch.Tensor) -> None:
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"{op}: needs a square matrix, got shape {tuple(a.shape)}")


def gemm(a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
    """C = alpha op(a) op(b) + beta C.  op(a): (..., m, k), op(b): (..., k, n) -> (..., m, n).

    With ``out`` given the result is written there (and beta scales its old content);
    without ``out``, beta is ignored (there is no C to scale).
    """
    A = a.mT if trans_a else a
    B = b.mT if trans_b else b
    if A.shape[-1] != B.shape[-2]:
        raise ValueError(f"gemm: inner dimensions differ: op(a) {tuple(A.shape)}, op(b) {tuple(B.shape)}")
    if out is None:
        c = torch.matmul(A, B)
        return c.mul_(alpha) if alpha != 1.0 else c
    if beta == 0.0:
        torch.matmul(A, B, out=out)
        return out.mul_(alpha) if alpha != 1.0 else out
    if A.ndim == 2 and B.ndim == 2:
        return out.addmm_(A, B, beta=beta, alpha=alpha)
    if A.ndim == 3 and B.ndim == 3:
        return out.baddbmm_(A, B, beta=beta, alpha=alpha)
    return out.mul_(beta).add_(torch.matmul(A, B), alpha=alpha)


def syrk_blocks(n: int, k: int | None = None) -> list[tuple[int, int]]:
    """Row blocks [(r0, r1), ...] of the blocked lower-triangle SYRK for an (n, n) result of
    inner dimension k (k=None: as if k were large). One block means a single full GEMM."""
    if n < 2 * SYRK_MIN_BLOCK or (k is not None and k < SYRK_MIN_K):
        return [(0, n)]
    nb = max(SYRK_MIN_BLOCK, -(-n // SYRK_MAX_BLOCKS))
    nb = -(-nb // 32) * 32
    return [(r0, min(n, r0 + nb)) for r0 in range(0, n, nb)]


def syrk_work_fraction(n: int, k: int | None = None) -> float:
    """Flops of the blocked SYRK relative to the full GEMM a a^T (0.5 would be the exact triangle)."""
    return sum((r1 - r0) * r1 for r0, r1 in syrk_blocks(n, k)) / float(n * n) if n else 0.0


def syrk(a, *, trans=False, alpha=1.0, uplo="lower", full=True):
    """C = alpha a a^T (a: (n, k)) or, trans=True, alpha a^T a (a: (k, n)) -> (n, n).

    For n >= 256 and k >= 128 computes only the block lower triangle: block row I is
    A[I] A[:end(I)]^T, one GEMM per block row, about (1 + 1/nblocks)/2 of the full product's
    flops (see syrk_blocks); smaller or thinner products are one GEMM. The result is exactly
    symmetric: its strict upper triangle is the mirror of the lower one (one masked pass).
    full=False returns only the ``uplo`` triangle (the other is zero).
    """
    _check_side_uplo("syrk", None, uplo)
    if a.ndim != 2:
        raise ValueError(f"syrk: needs a 2-D matrix, got shape {tuple(a.shape)}")
    A = a.mT if trans else a
    n, k = A.shape
    blocks = syrk_blocks(n, k)
    if len(blocks) == 1:
        c = torch.matmul(A, A.mT)
    else:
        c = torch.empty((n, n), dtype=A.dtype, device=A.device)  # strict upper part stays unset
        for r0, r1 in blocks:
            c[r0:r1, :r1] = torch.matmul(A[r0:r1], A[:r1].mT)
    if alpha != 1.0:
        c.mul_(alpha)
    if full:
        lower = torch.ones((n, n), dtype=torch.bool, device=A.device).tril_()
        return torch.where(lower, c, c.mT)
    return syrk_triangle(c, uplo)


def syrk_triangle(c, uplo: str):
    """The ``uplo`` triangle of a symmetric (n, n) ``c`` (the other triangle zero); c is overwritten."""
    c = c.tril_()
    return c if uplo == "lower" else c.mT.contiguous()


def trsm(a, b, *, side="left", uplo="lower", trans=False, unit_diagonal=False, out=None):
    """Solve op(a) X = b (side='left', b: (n, m) or (n,)) or X op(a) = b (side='right', b: (m, n)).

    a: (n, n) triangular ('lower' or 'upper' says which triangle of a is read; the other is
    ignored), op(a) = a^T when trans; unit_diagonal treats diag(a) as ones. ``out``: X is
    written there, with the bits of a new X: a column-major ``out`` (b itself: the transpose of a
    row-major matrix) by LAPACK's own solve in place, no temporary; another layout through one.
    """
    _check_side_uplo("trsm", side, uplo)
    _check_square("trsm", a)
    n = a.shape[-1]
    vec = b.ndim == 1
    if vec:
        if side != "left":
            raise ValueError("trsm: a 1-D right-hand side needs side='left'")
        b = b.unsqueeze(-1)
        out = out.unsqueeze(-1) if out is not None else None
    dim = -2 if side == "left" else -1
    if b.shape[dim] != n:
        raise ValueError(f"trsm: a is {tuple(a.shape)} but b is {tuple(b.shape)} for side={side!r}")
    upper = uplo == "upper"
    A = a  # solve_triangular reads only the named triangle (documented)
    if trans:
        A, upper = a.mT, not upper
    in_place = out is not None and out.stride(-2) == 1  # column-major: LAPACK's own in-place solve
    kw = {"out": out} if in_place else {}
    x = torch.linalg.solve_triangular(A, b, upper=upper, left=(side == "left"), unitriangular=unit_diagonal, **kw)
    if out is not None and not in_place:  # row-major: solved in place it would be its transpose (other bits)
        x = out.copy_(x)
    return x.squeeze(-1) if vec else x


def cholesky(a):
    """Lower-triangular L (n, n) with a = L L^T for SPD a (only the lower triangle of a is read).

    Raises NotPositiveDefiniteError (a torch.linalg.LinAlgError) naming the failing minor.
    """
    _check_square("cholesky", a)
    L, info = torch.linalg.cholesky_ex(a)
    bad = int(info.max()) if info.numel() > 1 else int(info)
    if bad > 0:
        raise NotPositiveDefiniteError(
            f"cholesky: the matrix ({tuple(a.shape)}, {a.dtype}) is not positive definite: the leading "
            f"minor of order {bad} is not positive; use inv_sqrt_spd(method='eigh') for near-singular matrices"
        )
    return L


def eigh(a):
    """(w, v): eigenvalues ascending (n,) and eigenvectors as columns (n, n) of symmetric a (n, n)
    (only its lower triangle is read)."""
    _check_square("eigh", a)
    return torch.linalg.eigh(a)


def inv_sqrt_eigh(a, *, threshold=1e-10, relative=False):
    """a^{-1/2} (n, n) of symmetric PSD ``a`` by eigendecomposition, dropping eigenvalues <= cutoff.

    cutoff = threshold (absolute, as PySCF's DF metric) or threshold * max eigenvalue (relative=True,
    as Psi4's fitting metric). The result is the pseudo-inverse square root on the kept space.
    Returns (X, info): info = {method, dropped, kept, threshold, relative, cutoff, eig_min, eig_max}.
    """
    _check_square("inv_sqrt_spd", a)
    w, v = torch.linalg.eigh(a)
    wmax = float(w[-1]) if w.numel() else 0.0
    cutoff = threshold * wmax if relative else threshold
    keep = w > cutoff
    nkeep = int(keep.sum())
    v = v[:, keep]
    x = (v * w[keep].rsqrt()) @ v.mT
    return x, {
        "method": "eigh",
        "dropped": int(w.numel() - nkeep),
        "kept": nkeep,
        "threshold": threshold,
        "relative": relative,
        "cutoff": cutoff,
        "eig_min": float(w[0]) if w.numel() else math.nan,
        "eig_max": wmax,
    }


def mp2_pair_energy(  # noqa: PLR0913
    Bi,
    Bj,
    eps_i,
    eps_j,
    eps_vir,
    *,
    symmetric=False,
    eps_vir_j=None,
    max_block_elems=PAIR_CHUNK_ELEMS,
    matmul=torch.matmul,
    serial=contextlib.nullcontext,
):
    """MP2 opposite- and same-spin sums over all pairs (i, j) in I x J (see Backend contract).

    ``eps_vir_j`` (nvir_j,): i and j have different spins (UMP2's alpha-beta block): Bj is
    (nj, nvir_j, naux) with its own virtuals, K is rectangular (nvir, nvir_j), only e_os is
    defined and e_ss is returned as NaN.

    Per i and chunk of j, K[a, j, b] = sum_P B_ia^P B_jb^P is ONE 2-D GEMM (nvir x naux) @
    (naux x nj*nvir) in the working precision: with B stored as Bt (naux, nocc*nvir) (the
    pipeline's layout) both operands are views, nothing is copied. The terms K^2/D and K K^T/D
    are formed in the working precision (fp32 terms carry ~1 ulp each, far below the fp32
    GEMM's own error) and every sum is accumulated in fp64; at most ``max_block_elems``
    elements of K at a time.

    On the CPU the rows i are shared among torch's threads, each running its GEMMs on one
    thread (as PySCF's MP2 kernel does with OpenMP): this keeps both cores busy on the
    elementwise work too and degrades gracefully when another job holds a core. Per-row sums
    are combined in row order, so the result does not depend on the thread count.

    ``matmul(A, B)``: the GEMM of K (linalg.openblas.openblas_matmul when OpenBLAS runs it);
    ``serial()``: a context that keeps it on one thread while the rows run threaded.
    """
    ni, nvir, naux = Bi.shape
    nj, nvj = Bj.shape[0], Bj.shape[1]
    mixed = eps_vir_j is not None
    check_pair_shapes("mp2_pair_energy", Bi, Bj, symmetric, mixed)
    f64 = torch.float64
    dev = Bi.device
    ei, ej = eps_i.to(device=dev, dtype=f64), eps_j.to(device=dev, dtype=f64)
    ev = eps_vir.to(device=dev, dtype=f64)
    evj = eps_vir_j.to(device=dev, dtype=f64) if mixed else ev
    bj2 = Bj.permute(2, 0, 1).reshape(naux, nj * nvj)  # a view when Bj comes from Bt
    jchunk = max(1, max_block_elems // max(1, nvir * nvj))

    def row(i):
        e_os = torch.zeros((), dtype=f64, device=dev)
        e_ss = torch.zeros((), dtype=f64, device=dev)
        jend = i + 1 if symmetric else nj
        e_ia = ei[i] - ev  # (a,)
        for j0 in range(0, jend, jchunk):
            j1 = min(jend, j0 + jchunk)
            K = matmul(Bi[i], bj2[:, j0 * nvj : j1 * nvj]).view(nvir, j1 - j0, nvj)
            D = (e_ia[:, None, None] + (ej[j0:j1, None] - evj[None, :])).to(K.dtype)  # (a, j, b)
            Kd = K / D
            os_ = (K * Kd).sum(dim=(0, 2), dtype=f64)
            if mixed:  # alpha-beta: no exchange term
                e_os += os_.sum()
                continue
            ss_ = os_ - (Kd * K.permute(2, 1, 0)).sum(dim=(0, 2), dtype=f64)
            if symmetric:
                w = torch.full((j1 - j0,), 2.0, dtype=f64, device=dev)
                if j0 <= i < j1:
                    w[i - j0] = 1.0
                os_, ss_ = os_ * w, ss_ * w
            e_os += os_.sum()
            e_ss += ss_.sum()
        return e_os, e_ss

    rows = _map_rows(row, ni, lambda i: -(i + 1 if symmetric else nj), dev, serial)  # longest rows first
    e_os = torch.zeros((), dtype=f64, device=dev)
    e_ss = torch.zeros((), dtype=f64, device=dev)
    for os_, ss_ in rows:
        e_os += os_
        e_ss += ss_
    return float(e_os), (math.nan if mixed else float(e_ss))


def _map_rows(row, ni: int, order_key, dev: torch.device, serial) -> list:
    """[row(i) for i in range(ni)], in row order. On the CPU with several threads the rows are
    shared among torch's threads in the order ``order_key`` gives, each row on one thread (torch's,
    and under ``serial()`` the GEMM library's); torch's thread count is restored afterwards."""
    nthreads = torch.get_num_threads()
    if dev.type != "cpu" or nthreads == 1 or ni == 1:
        return [row(i) for i in range(ni)]
    from concurrent.futures import ThreadPoolExecutor

    order = sorted(range(ni), key=order_key)
    with serial():
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(max_workers=min(nthreads, ni)) as pool:
                done = dict(zip(order, pool.map(row, order)))
        finally:
            torch.set_num_threads(nthreads)
    return [done[i] for i in range(ni)]


def check_pair_shapes(op: str, Bi, Bj, symmetric: bool, mixed: bool) -> None:
    """The shape rules of the mp2_pair_energy contract: Bi (ni, nvir, naux), Bj (nj, nvir_j, naux)
    with nvir_j = nvir unless the spins differ (``mixed``: eps_vir_j given); symmetric means Bj is
    Bi, so not with mixed spins."""
    if Bi.ndim != 3 or Bj.ndim != 3:
        raise ValueError(f"{op}: Bi and Bj must be (n, nvir, naux), got {tuple(Bi.shape)} and {tuple(Bj.shape)}")
    if (Bj.shape[2] != Bi.shape[2]) if mixed else (Bj.shape[1:] != Bi.shape[1:]):
        raise ValueError(
            f"{op}: Bi {tuple(Bi.shape)} and Bj {tuple(Bj.shape)} differ in {'naux' if mixed else '(nvir, naux)'}"
        )
    if symmetric and (mixed or Bj.shape[0] != Bi.shape[0]):
        raise ValueError(f"{op}: symmetric=True needs Bj to be Bi (same spin)")
