"""Property tests (hypothesis) for gemm, trsm and cholesky on Philox data; few examples, no deadline."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfmp2.linalg import cholesky, gemm, get_backend, random_matrix, random_spd, trsm

BE = get_backend("cpu")
dims = st.integers(1, 40)
seeds = st.integers(0, 2**64 - 1)
dtypes = st.sampled_from([torch.float32, torch.float64])
TOL = {torch.float32: 1e-4, torch.float64: 1e-11}


@settings(max_examples=30, deadline=None)
@given(dims, dims, dims, st.booleans(), st.booleans(), st.floats(-3, 3), seeds, dtypes)
def test_gemm_matches_matmul(m, k, n, ta, tb, alpha, seed, dtype):
    a = random_matrix((k, m) if ta else (m, k), seed, dtype=dtype)
    b = random_matrix((n, k) if tb else (k, n), seed, dtype=dtype, offset=4 * m * k + 4)
    c = gemm(a, b, trans_a=ta, trans_b=tb, alpha=alpha, backend=BE)
    ref = alpha * ((a.double().T if ta else a.double()) @ (b.double().T if tb else b.double()))
    assert c.shape == (m, n)
    assert torch.allclose(c.double(), ref, rtol=0, atol=TOL[dtype] * max(1.0, abs(alpha)) * k * 4)


@settings(max_examples=30, deadline=None)
@given(
    dims,
    st.integers(1, 10),
    st.sampled_from(["left", "right"]),
    st.sampled_from(["lower", "upper"]),
    st.booleans(),
    st.booleans(),
    seeds,
)
def test_trsm_solves(n, m, side, uplo, trans, unit, seed):
    a = random_matrix((n, n), seed) * 0.2
    a.diagonal().copy_(1.5 + a.diagonal().abs())
    b = random_matrix((n, m) if side == "left" else (m, n), seed, offset=2 * n * n + 4)
    x = trsm(a, b, side=side, uplo=uplo, trans=trans, unit_diagonal=unit, backend=BE)
    T = torch.tril(a) if uplo == "lower" else torch.triu(a)
    if unit:
        T.diagonal().fill_(1.0)
    opT = T.T if trans else T
    back = opT @ x if side == "left" else x @ opT
    assert torch.allclose(back, b, atol=1e-9 * max(1.0, float(x.abs().max())))


@settings(max_examples=20, deadline=None)
@given(dims, st.floats(1.0, 1e6), seeds, dtypes)
def test_cholesky_reconstructs(n, cond, seed, dtype):
    a = random_spd(n, cond, seed % 2**32, dtype=dtype)
    L = cholesky(a, backend=BE)
    assert torch.equal(L, torch.tril(L)) and (L.diagonal() > 0).all()
    assert torch.allclose((L.double() @ L.double().T), a.double(), atol=TOL[dtype] * 10)
