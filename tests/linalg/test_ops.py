"""linalg ops on the CPU backend against torch.linalg / scipy.linalg references on Philox data."""

import itertools

import numpy as np
import pytest
import scipy.linalg as sla
import torch

from dfmp2 import linalg
from dfmp2.linalg import (
    NotPositiveDefiniteError,
    cholesky,
    gemm,
    get_backend,
    inv_sqrt_spd,
    mp2_pair_energy,
    random_matrix,
    random_spd,
    syrk,
    trsm,
)
from dfmp2.linalg.reference import mp2_pair_energy_reference
from dfmp2.linalg.torch_ops import syrk_blocks, syrk_work_fraction

DTYPES = [torch.float64, torch.float32]
# relative tolerance per dtype for O(k)-term dot products
RTOL = {torch.float64: 1e-12, torch.float32: 2e-5}
# (m, k, n) including 1x1, non-square, and sizes that are not multiples of 128
SHAPES = [(1, 1, 1), (1, 7, 1), (3, 1, 5), (17, 33, 9), (128, 128, 128), (129, 255, 67), (300, 5, 2), (2, 400, 3)]


@pytest.fixture(scope="module")
def be():
    return get_backend("cpu")


def mat(shape, seed, dtype):
    return random_matrix(shape, seed, dtype=dtype)


def close(x, ref, dtype, scale=None):
    ref = torch.as_tensor(ref).to(x.dtype)
    scale = scale if scale is not None else max(1.0, float(ref.abs().max()))
    err = float((x - ref).abs().max()) if x.numel() else 0.0
    assert err <= RTOL[dtype] * scale * 10, (err, scale)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("ta,tb", list(itertools.product([False, True], repeat=2)))
def test_gemm_vs_numpy(be, dtype, m, k, n, ta, tb):
    a = mat((k, m) if ta else (m, k), m * 1000 + k, dtype)
    b = mat((n, k) if tb else (k, n), n * 1000 + k + 1, dtype)
    A = a.double().numpy().T if ta else a.double().numpy()
    B = b.double().numpy().T if tb else b.double().numpy()
    c = gemm(a, b, trans_a=ta, trans_b=tb, alpha=0.5, backend=be)
    assert c.shape == (m, n) and c.dtype == dtype
    close(c, 0.5 * A @ B, dtype, scale=max(1.0, k**0.5 * 4))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gemm_beta_out_and_batched(be, dtype):
    a, b, c0 = mat((33, 20), 1, dtype), mat((20, 17), 2, dtype), mat((33, 17), 3, dtype)
    out = c0.clone()
    r = gemm(a, b, alpha=2.0, beta=-0.5, out=out, backend=be)
    assert r.data_ptr() == out.data_ptr()
    close(out, 2 * (a.double() @ b.double()) - 0.5 * c0.double(), dtype, scale=20)
    out2 = torch.empty(33, 17, dtype=dtype)
    gemm(a, b, out=out2, backend=be)
    close(out2, a.double() @ b.double(), dtype, scale=20)
    ab, bb, cb = mat((4, 5, 6), 4, dtype), mat((4, 6, 3), 5, dtype), mat((4, 5, 3), 6, dtype)
    out3 = cb.clone()
    gemm(ab, bb, beta=1.0, out=out3, backend=be)
    close(out3, torch.bmm(ab.double(), bb.double()) + cb.double(), dtype, scale=10)
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm(a, a, backend=be)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n,k", [(1, 1), (1, 9), (5, 1), (100, 37), (255, 64), (300, 7), (777, 50), (300, 130), (700, 128)]
)
@pytest.mark.parametrize("trans", [False, True])
def test_syrk_equals_a_at(be, dtype, n, k, trans):
    a = mat((k, n) if trans else (n, k), n + 7 * k, dtype)
    A = a.mT if trans else a
    c = syrk(a, trans=trans, backend=be)
    assert c.shape == (n, n)
    assert torch.equal(c, c.mT)  # exactly symmetric
    close(c, A.double() @ A.double().mT, dtype, scale=max(1.0, 4 * k))
    lo = syrk(a, trans=trans, alpha=-2.0, full=False, backend=be)
    up = syrk(a, trans=trans, uplo="upper", full=False, backend=be)
    assert torch.equal(lo, torch.tril(lo)) and torch.equal(up, torch.triu(up))
    assert torch.equal(lo, -2.0 * torch.tril(c)) and torch.equal(up, torch.triu(c))


def test_syrk_does_about_half_the_work():
    assert syrk_blocks(100) == [(0, 100)] and syrk_blocks(1000, 64) == [(0, 1000)]
    for n, bound in ((512, 0.63), (1000, 0.6), (4096, 0.57)):
        blocks = syrk_blocks(n)
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(b[1] == c[0] for b, c in itertools.pairwise(blocks))
        assert syrk_work_fraction(n) <= bound
    be = get_backend("cpu", cpu_blas="torch")  # the torch path (auto may pick OpenBLAS's SYRK)
    syrk(mat((600, 130), 1, torch.float64), backend=be)
    assert "syrk:torch.matmul(block-triangle)" in be.describe()["kernels"]


TRSM_COMBOS = list(itertools.product(["left", "right"], ["lower", "upper"], [False, True], [False, True]))


def tri(n, uplo, seed, dtype):
    """Well-conditioned triangular matrix; the other triangle holds garbage that must be ignored."""
    a = mat((n, n), seed, torch.float64) * 0.3
    a.diagonal().copy_(2.0 + a.diagonal().abs())
    return a.to(dtype)


@pytest.mark.parametrize("side,uplo,trans,unit", TRSM_COMBOS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,m", [(1, 1), (7, 3), (130, 45)])
def test_trsm_all_16_combinations_vs_scipy(be, side, uplo, trans, unit, dtype, n, m):
    a = tri(n, uplo, n + m, dtype)
    b = mat((n, m) if side == "left" else (m, n), 99 + n, dtype)
    x = trsm(a, b, side=side, uplo=uplo, trans=trans, unit_diagonal=unit, backend=be)
    A, B = a.double().numpy(), b.double().numpy()
    lower = uplo == "lower"
    if side == "left":  # op(A) X = B
        ref = sla.solve_triangular(A, B, lower=lower, trans=1 if trans else 0, unit_diagonal=unit)
    else:  # X op(A) = B  <=>  op(A)^T X^T = B^T
        ref = sla.solve_triangular(A, B.T, lower=lower, trans=0 if trans else 1, unit_diagonal=unit).T
    assert x.shape == b.shape and x.dtype == dtype
    scale = max(1.0, float(np.abs(ref).max()))
    # unit-diagonal solves with the random 0.3-scaled triangle grow like a product of (1 + |l|)
    tol = (1e-10 if dtype == torch.float64 else 1e-3) * (10 if unit else 1)
    assert float(np.abs(x.double().numpy() - ref).max()) <= tol * scale


@pytest.mark.parametrize("side,uplo,trans,unit", TRSM_COMBOS)
@pytest.mark.parametrize("layout", ["rows", "columns"])
def test_trsm_overwrite_b_is_the_same_solve_in_b(be, side, uplo, trans, unit, layout):
    """``overwrite_b``: X lands in b's own storage (b returned) with the bits of a new X, for b
    row-major or column-major (the JK factor's fit solves each group of rows in place)."""
    n, m = 37, 53
    a = tri(n, uplo, 5, torch.float64)
    shape = (n, m) if side == "left" else (m, n)
    b = mat(shape, 11, torch.float64) if layout == "rows" else mat(shape[::-1], 11, torch.float64).mT
    kw = dict(side=side, uplo=uplo, trans=trans, unit_diagonal=unit, backend=be)
    x = trsm(a, b, **kw)
    ptr, got = b.data_ptr(), trsm(a, b, overwrite_b=True, **kw)
    assert got is b and b.data_ptr() == ptr and torch.equal(b, x)


def test_trsm_vector_rhs_and_errors(be):
    a = tri(6, "lower", 1, torch.float64)
    b = mat(6, 2, torch.float64)
    x = trsm(a, b, backend=be)
    assert x.shape == (6,)
    assert torch.allclose(torch.tril(a) @ x, b)
    with pytest.raises(ValueError, match="side"):
        trsm(a, b[:, None], side="middle", backend=be)
    with pytest.raises(ValueError, match="uplo"):
        trsm(a, b[:, None], uplo="diag", backend=be)
    with pytest.raises(ValueError, match="square"):
        trsm(a[:, :5], b[:, None], backend=be)
    with pytest.raises(ValueError):
        trsm(a, mat((5, 2), 3, torch.float64), backend=be)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 2, 31, 129, 200])
def test_cholesky_vs_scipy(be, dtype, n):
    a = random_spd(n, 1e3, n, dtype=dtype)
    L = cholesky(a, backend=be)
    ref = sla.cholesky(a.double().numpy(), lower=True)
    assert torch.equal(L, torch.tril(L))
    tol = 1e-12 if dtype == torch.float64 else 1e-3
    assert float(np.abs(L.double().numpy() - ref).max()) < tol


def test_cholesky_not_spd_error(be):
    a = torch.eye(4, dtype=torch.float64)
    a[2, 2] = -1.0
    with pytest.raises(NotPositiveDefiniteError, match="minor of order 3"):
        cholesky(a, backend=be)
    with pytest.raises(torch.linalg.LinAlgError):  # still catchable as torch's error
        cholesky(a, backend=be)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 20, 130])
def test_inv_sqrt_eigh_vs_scipy(be, dtype, n):
    a = random_spd(n, 1e3, 5, dtype=dtype)
    x, info = inv_sqrt_spd(a, backend=be)
    ref = sla.fractional_matrix_power(a.double().numpy(), -0.5).real
    assert info["method"] == "eigh" and info["dropped"] == 0 and info["kept"] == n
    tol = 1e-10 if dtype == torch.float64 else 1e-3
    assert float(np.abs(x.double().numpy() - ref).max()) <= tol * float(np.abs(ref).max())


def test_inv_sqrt_eigh_drops_near_singular_directions(be):
    n = 12
    q, _ = torch.linalg.qr(random_matrix((n, n), 3))
    # Kept spectrum 1, 3e-1, ..., 3e-8: no eigenvalue within a factor 3 of either cutoff (absolute
    # 1e-10, relative 1e-6 * 1), so rounding in eigh cannot move one across (with 10^-k, one sat
    # exactly on the relative cutoff and the count depended on the last bit).
    w = torch.tensor([1e-14, 1e-12, 1e-11, 1.0] + [3.0 * 10.0**-k for k in range(1, n - 3)], dtype=torch.float64)
    a = (q * w) @ q.T
    x, info = inv_sqrt_spd(a, backend=be)
    assert info["dropped"] == 3 and info["kept"] == n - 3 and info["threshold"] == 1e-10
    assert torch.isfinite(x).all()
    keep = q[:, 3:]
    # X is the inverse square root on the kept space: X A X = projector onto it
    assert torch.allclose(x @ a @ x, keep @ keep.T, atol=1e-8)
    _, info_rel = inv_sqrt_spd(a, threshold=1e-6, relative=True, backend=be)
    assert info_rel["dropped"] == 5 and info_rel["kept"] == n - 5 and info_rel["cutoff"] == pytest.approx(1e-6)
    with pytest.raises(ValueError, match="method"):
        inv_sqrt_spd(a, method="magic", backend=be)


@pytest.mark.parametrize("path", ["gemm+epilogue", "gemm+torch"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_mp2_pair_energy_vs_naive_einsum(dtype, path):
    """Both CPU pair-step paths (linalg.cpu_pair) against the einsum reference, on the diagonal
    block, the full square and an off-diagonal block; the record names the path that ran."""
    be = get_backend("cpu", pair_kernel=path)
    p = linalg.synthetic_problem(7, 23, 41, seed=5)
    B = p.B.to(dtype)
    e_ref = mp2_pair_energy_reference(B, B, p.eps_occ, p.eps_occ, p.eps_vir)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    e_sym = mp2_pair_energy(B, B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True, backend=be)
    e_full = mp2_pair_energy(B, B, p.eps_occ, p.eps_occ, p.eps_vir, backend=be)
    for e in (e_sym, e_full):
        assert e[0] == pytest.approx(e_ref[0], rel=tol) and e[1] == pytest.approx(e_ref[1], rel=tol)
    # off-diagonal block I x J, and (gemm+torch's rows) chunking over j
    Bi, Bj = B[:3], B[3:]
    e_ref_ij = mp2_pair_energy_reference(Bi, Bj, p.eps_occ[:3], p.eps_occ[3:], p.eps_vir)
    e_ij = mp2_pair_energy(Bi, Bj, p.eps_occ[:3], p.eps_occ[3:], p.eps_vir, backend=be)
    from dfmp2.linalg.torch_ops import mp2_pair_energy as raw

    e_chunked = raw(Bi, Bj, p.eps_occ[:3], p.eps_occ[3:], p.eps_vir, max_block_elems=23 * 23 * 2)
    for e in (e_ij, e_chunked):
        assert e[0] == pytest.approx(e_ref_ij[0], rel=tol) and e[1] == pytest.approx(e_ref_ij[1], rel=tol)
    pair = {k.split(":", 1)[1] for k in be.describe()["kernels"] if k.startswith("mp2_pair_energy:")}
    layout, tail = ("tiles", "+pair_epilogue.c(fp64 sums)") if path == "gemm+epilogue" else ("rows", "+torch")
    gemms = {
        f"torch.matmul({layout})",
        f"openblas.{'d' if dtype == torch.float64 else 's'}gemm(numpy.matmul, {layout})",
    }
    assert pair and pair <= {g + tail for g in gemms}, pair
    assert be.describe()["pair_path"] == {"fp64": path, "fp32": path}
