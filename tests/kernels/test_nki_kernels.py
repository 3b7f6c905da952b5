"""Each NKI kernel against its torch fp64 reference on Philox data.

Default channel: the NumPy emulator (kernels/nki_emulator). ``nki_sim`` channel: the same
kernels under AWS's nki.simulate (skipped without AWS's nki package).

fp32 expectations (u = 2^-24, the fp32 unit roundoff; references are fp64 on the same
fp32-rounded inputs, so only the kernels' own rounding is measured):
- GEMM / SYRK: elementwise |C - C_ref| <= 4 sqrt(K) u (|A| |B|)_ij (probabilistic bound of a
  K-term fp32 dot product; the worst-case bound is K u).
- TRSM: normwise backward error ||B - L X||_F / (||L||_F ||X||_F) <= 4 sqrt(n) u, and forward
  error ||X - X_ref||_F / ||X_ref||_F <= 4 sqrt(n) u cond(L).
- MP2 pair kernel: |E_OS - ref| and |E_SS - ref| <= 4 sqrt(naux) u |E_OS_ref| (K elements
  carry ~sqrt(naux) u relative error; the sums of same-sign terms and the fp64 host sums add
  nothing larger).
"""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from dfmp2.kernels.nki import engines
from dfmp2.kernels.nki.gemm import gemm_kernel
from dfmp2.kernels.nki.mp2_pair import mp2_pair_kernel
from dfmp2.kernels.nki.syrk import syrk_lower_kernel
from dfmp2.kernels.nki.trsm import trsm_lower_kernel
from dfmp2.linalg import torch_ops
from dfmp2.linalg.synthetic import random_matrix, random_spd, synthetic_problem

U = 2.0**-24
ENGINES = [engines.EMULATOR, pytest.param(engines.NKI_SIMULATE, marks=pytest.mark.nki_sim)]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=ENGINES)
def runner(request):
    return engines.KernelRunner(request.param, "trn1")


def philox32(shape, seed):
    return random_matrix(shape, seed, dtype=torch.float32).numpy()


def f64(x):
    return torch.from_numpy(np.asarray(x, dtype=np.float64))


# (M, K, N): tiny, ragged in every dim, exact multiples, N over one PSUM bank, tall-skinny both ways
GEMM_SHAPES = [(1, 1, 1), (5, 7, 3), (130, 200, 77), (128, 256, 512), (257, 129, 513), (1500, 24, 5), (6, 1100, 4)]


@pytest.mark.parametrize("M,K,N", GEMM_SHAPES)
def test_gemm_kernel(runner, M, K, N):
    a, b = philox32((M, K), 1), philox32((K, N), 2)
    c = runner(gemm_kernel, np.ascontiguousarray(a.T), b)
    ref = torch_ops.gemm(f64(a), f64(b)).numpy()
    scale = np.abs(a).astype(np.float64) @ np.abs(b)
    err = np.max(np.abs(c - ref) / scale)
    assert c.shape == (M, N) and c.dtype == np.float32
    assert err <= 4 * math.sqrt(K) * U, err


@pytest.mark.parametrize("N,K", [(1, 1), (5, 3), (129, 200), (300, 64), (700, 9)])
def test_syrk_kernel_lower_blocks(runner, N, K):
    a = philox32((N, K), 3)
    c = runner(syrk_lower_kernel, np.ascontiguousarray(a.T))
    ref = torch_ops.gemm(f64(a), f64(a), trans_b=True).numpy()
    scale = np.abs(a).astype(np.float64) @ np.abs(a).T
    lower = np.tril(np.ones((N, N), dtype=bool))
    assert np.isfinite(c[lower]).all()
    err = np.max(np.abs(c - ref)[lower] / scale[lower])
    assert err <= 4 * math.sqrt(K) * U, err
    # Only the lower tile blocks are computed: with more than one row block, the strictly
    # upper 128-blocks are never written (NaN sentinels from nl.ndarray).
    if N > 128 and runner.engine == engines.EMULATOR:
        assert np.isnan(c[:128, 128:]).all()


def _dinvT(L):
    n = L.shape[0]
    nblk = -(-n // 128)
    d = np.zeros((nblk, 128, 128), dtype=np.float32)
    for kb in range(nblk):
        k0, kt = kb * 128, min(128, n - kb * 128)
        d[kb, :kt, :kt] = scipy.linalg.solve_triangular(
            L[k0 : k0 + kt, k0 : k0 + kt].astype(np.float64), np.eye(kt), lower=True
        ).T
    return d


@pytest.mark.parametrize("n,m", [(1, 1), (5, 3), (84, 95), (300, 40), (129, 600)])
def test_trsm_kernel(runner, n, m):
    L = torch_ops.cholesky(random_spd(n, 1e4, seed=4)).float().numpy()
    b = philox32((n, m), 5)
    x = runner(trsm_lower_kernel, np.ascontiguousarray(L.T), _dinvT(L), b)
    Ld, xd, bd = f64(L), f64(x), f64(b)
    ref = torch_ops.trsm(Ld, bd, side="left", uplo="lower")
    backward = float(torch.linalg.norm(bd - Ld @ xd) / (torch.linalg.norm(Ld) * torch.linalg.norm(xd)))
    forward = float(torch.linalg.norm(xd - ref) / torch.linalg.norm(ref))
    cond_l = float(torch.linalg.cond(Ld))
    assert backward <= 4 * math.sqrt(n) * U, backward
    assert forward <= 4 * math.sqrt(n) * U * cond_l, (forward, cond_l)


def _pair_inputs(p, i0, i1, j0, j1):
    B = p.B.float().numpy()
    bT = np.ascontiguousarray(B.transpose(0, 2, 1))
    eo = p.eps_occ.float().numpy()
    ev = p.eps_vir.float().numpy()
    return (
        bT[i0:i1],
        bT[j0:j1],
        np.ascontiguousarray(np.broadcast_to(eo[i0:i1], (128, i1 - i0))),
        np.ascontiguousarray(np.broadcast_to(eo[j0:j1], (128, j1 - j0))),
        np.ascontiguousarray(ev[:, None]),
        np.ascontiguousarray(np.broadcast_to(ev, (128, ev.size))),
    )


# (nocc, nvir, naux): water/cc-pVDZ-like, ragged nvir over one 128 row block and one 512
# column chunk, naux over several 128 chunks, tall-skinny nvir >> naux
PAIR_SHAPES = [(5, 19, 84), (4, 130, 200), (3, 600, 50), (6, 40, 300)]


@pytest.mark.parametrize("nocc,nvir,naux", PAIR_SHAPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_mp2_pair_kernel(runner, nocc, nvir, naux, symmetric):
    p = synthetic_problem(nocc, nvir, naux, seed=6, dtype=torch.float32)
    if symmetric:
        I = J = (0, nocc)
    else:
        I, J = (0, nocc // 2 + 1), (nocc // 2 + 1, nocc)
    args = _pair_inputs(p, *I, *J)
    part = runner(mp2_pair_kernel, *args, symmetric=symmetric)
    ni, nj = I[1] - I[0], J[1] - J[0]
    assert part.shape == (128, 2 * ni * nj)
    s = part.astype(np.float64).sum(axis=0).reshape(ni, nj, 2)
    w = (np.tril(np.full((ni, nj), 2.0), -1) + np.eye(ni)) if symmetric else np.ones((ni, nj))
    e_os = float((w * s[..., 0]).sum())
    e_ss = float((w * (s[..., 0] - s[..., 1])).sum())
    B64 = p.B.float().double()
    ref_os, ref_ss = torch_ops.mp2_pair_energy(
        B64[I[0] : I[1]],
        B64[J[0] : J[1]],
        p.eps_occ[I[0] : I[1]].float().double(),
        p.eps_occ[J[0] : J[1]].float().double(),
        p.eps_vir.float().double(),
        symmetric=symmetric,
    )
    tol = 4 * math.sqrt(naux) * U * abs(ref_os)
    assert abs(e_os - ref_os) <= tol, (e_os, ref_os)
    assert abs(e_ss - ref_ss) <= tol, (e_ss, ref_ss)
