"""Device-neutral linear-algebra ops.

Each op takes torch tensors and an optional ``backend``; without one, a torch backend
for the first operand's device is used. The backend executes the op and records the
kernel that ran; here, once it has returned, the call's flops (linalg.flops: the op's standard
count from the shapes) are charged to that backend (``Backend.count_flops``): the one place every
stage's linear algebra passes, so a stage's count follows whatever algorithm it runs. Shapes
follow BLAS conventions; see each docstring.
"""

from __future__ import annotations

import torch

from . import flops
from .backend import Backend, backend_for


def _be(backend: Backend | None, t: torch.Tensor) -> Backend:
    return backend if backend is not None else backend_for(t)


def gemm(a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None, backend=None):
    """C = alpha * op(a) @ op(b) + beta * out.   op(a): (m, k), op(b): (k, n) -> (m, n)."""
    be = _be(backend, a)
    c = be.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, out=out)
    be.count_flops("gemm", flops.gemm(a.shape, b.shape, trans_a, trans_b))
    return c


def syrk(a, *, trans=False, alpha=1.0, uplo="lower", full=True, backend=None):
    """C = alpha * a @ a.T (trans=False, a: (n, k)) or alpha * a.T @ a (trans=True, a: (k, n)) -> (n, n).

    Only a block triangle is computed (about half the GEMM's flops for n >= 256 and k >= 128;
    thinner products are memory-bound and use one GEMM);
    ``full=True`` mirrors it into an exactly symmetric result, ``full=False`` returns the
    ``uplo`` triangle with zeros elsewhere.
    """
    be = _be(backend, a)
    c = be.syrk(a, trans=trans, alpha=alpha, uplo=uplo, full=full)
    be.count_flops("syrk", flops.syrk(a.shape, trans))
    return c


def trsm(a, b, *, side="left", uplo="lower", trans=False, unit_diagonal=False, backend=None, overwrite_b=False):
    """Solve op(a) X = b (side='left') or X op(a) = b (side='right') for triangular a (n, n).

    uplo names the triangle of a that is read; op(a) = a^T when trans; unit_diagonal takes diag(a) = 1.
    b: (n, m) or (n,) for side='left', (m, n) for side='right'; X has b's shape. ``overwrite_b``:
    X is written into b and b returned, with the bits of a new X; on the torch backend with no
    temporary of b's size where b is column-major (LAPACK's in-place solve).
    """
    be = _be(backend, a)
    kw = {"overwrite_b": True} if overwrite_b else {}
    x = be.trsm(a, b, side=side, uplo=uplo, trans=trans, unit_diagonal=unit_diagonal, **kw)
    be.count_flops("trsm", flops.trsm(a.shape, b.numel()))
    return x


def cholesky(a, *, backend=None):
    """Lower-triangular L with a = L L^T for SPD a (n, n); NotPositiveDefiniteError otherwise."""
    be = _be(backend, a)
    L = be.cholesky(a)
    be.count_flops("cholesky", flops.cholesky(a.shape))
    return L


def inv_sqrt_spd(a, method="eigh", *, backend=None, **kwargs):
    """a^{-1/2} for SPD a (n, n). Returns (X, info) with info a dict.

    method="eigh": eigendecomposition; eigenvalues <= threshold (default 1e-10, absolute as in
    PySCF; relative=True makes it relative to the largest, as in Psi4) are dropped and
    info["dropped"] says how many (X is then the pseudo-inverse square root).
    method="newton_schulz": coupled, scaled Newton–Schulz iteration, GEMMs only
    (linalg.newton_schulz): info has iterations, residual = ||X A X - I||_F / sqrt(n), converged;
    raises ConvergenceError when it does not converge (check=False returns anyway).
    """
    be = _be(backend, a)
    x, info = be.inv_sqrt_spd(a, method=method, **kwargs)
    be.count_flops("inv_sqrt_spd", flops.inv_sqrt_spd(a.shape, info))
    return x, info


def eigh(a, *, backend=None):
    """Eigenvalues (ascending, (n,)) and orthonormal eigenvectors (columns, (n, n)) of symmetric
    a (n, n); only the lower triangle is read."""
    be = _be(backend, a)
    w, v = be.eigh(a)
    be.count_flops("eigh", flops.eigh(a.shape))
    return w, v


def mp2_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, eps_vir_j=None, backend=None):
    """(e_os, e_ss) in Hartree over all pairs in I x J; see Backend.mp2_pair_energy.
    ``eps_vir_j``: j of the other spin (UMP2 alpha-beta), e_ss is then NaN."""
    be = _be(backend, Bi)
    if eps_vir_j is None:  # backends without the opposite-spin form keep working
        e = be.mp2_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric)
    else:
        e = be.mp2_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric, eps_vir_j=eps_vir_j)
    be.count_flops("mp2_pair_energy", flops.mp2_pair_energy(Bi.shape, Bj.shape, symmetric))
    return e
