"""The fitting metric, below both stages that fit (the SCF's JK factor, the MP2 stage's B).

j2c = (P|Q) = L L^T            kind 'cholesky': M = L (lower)
j2c^-1/2 by eigh               kind 'eigh' when j2c is numerically not positive definite
                               (eigenvalues below EIGH_DROP dropped, as PySCF and Psi4 do)
fitted X = L^-1 X  or  M X     ``apply_metric``: (naux, n) -> (naux, n)
"""

from __future__ import annotations

import time

import torch

from dfmp2 import linalg

EIGH_DROP = 1e-10  # j2c eigenvalues below this are dropped by the eigh fallback


def fit_metric(j2c: torch.Tensor, backend) -> tuple[torch.Tensor, str, dict]:
    """Factor the fitting metric j2c (naux, naux) fp64. Returns (M, kind, info): kind 'cholesky'
    with M = L (lower, j2c = L L^T), or, when j2c is numerically not positive definite, kind
    'eigh' with M = j2c^-1/2 (info: what was dropped)."""
    try:
        return linalg.cholesky(j2c, backend=backend), "cholesky", {}
    except torch.linalg.LinAlgError:  # linalg.NotPositiveDefiniteError among them
        M, info = linalg.inv_sqrt_spd(j2c, method="eigh", threshold=EIGH_DROP, backend=backend)
        return M, "eigh", info


def metric_factor(auxmol, backend, timer, engine):
    """(M, kind, info) of ``fit_metric`` for the aux basis' j2c from the integral ``engine``,
    timed as 'integrals' and 'metric' on ``timer`` (dfmp2.timing.Timer)."""
    t0 = time.perf_counter()
    j2c = engine.metric(auxmol)
    t0 = timer.add("integrals", t0)
    out = fit_metric(j2c, backend)
    del j2c
    timer.add("metric", t0)
    return out


def apply_metric(M: torch.Tensor, kind: str, X: torch.Tensor, backend) -> torch.Tensor:
    """The fitted columns: L^-1 X (kind 'cholesky', M = L lower; TRSM) or M X (kind 'eigh',
    M = j2c^-1/2 symmetric; GEMM). M (naux, naux), X (naux, n) in one dtype on the device; a
    C-contiguous X gives a C-contiguous result. Cholesky: solved as Y L^T = X^T, Y the result's
    transpose (a right-side TRSM of the transposed view), which LAPACK reads and writes in its own
    column-major layout; the left-side solve of a row-major X costs a transposed copy in and one
    out, and ran at about two thirds of the right-side's rate (scripts/results/scf_kernels.md)."""
    if kind == "cholesky":
        return linalg.trsm(M, X.mT, side="right", uplo="lower", trans=True, backend=backend).mT
    return linalg.gemm(M, X, backend=backend)


def describe_metric(kind: str, info: dict) -> str:
    """'cholesky', or 'eigh (dropped n)' for the result's record."""
    return kind if kind == "cholesky" else f"eigh (dropped {info['dropped']})"
