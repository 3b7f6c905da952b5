"""A^{-1/2} of an SPD matrix by the coupled Newton–Schulz iteration (GEMMs only).

Device-neutral: every O(n^3) step goes through the ``matmul`` callable the backend passes
(torch.matmul on cpu/cuda; the NKI GEMM on Trainium), everything else is O(n^2) elementwise.

Iteration (Higham, *Functions of Matrices*, eq. 6.35, with Chen & Chow's scaling,
SIAM J. Sci. Comput. 36 (2014)): with s >= lambda_max(A),

    Y_0 = A / s,  Z_0 = I
    P_k = Z_k Y_k,   T_k = (alpha_k / 2) (3 I - alpha_k^2 P_k)
    Y_{k+1} = Y_k T_k,   Z_{k+1} = T_k Z_k          ->  Z -> (A/s)^{-1/2},  A^{-1/2} = Z / sqrt(s)

This is the Newton–Schulz sign iteration on [[0, A/s], [I, 0]], whose eigenvalues are
+-sqrt(lambda/s) in [l_0, 1]. alpha_k = sqrt(3 / (1 + l_k + l_k^2)) makes the cubic map equal
at l_k and 1, so the interval [l_k, 1] maps onto [l_{k+1}, 1] with
l_{k+1} = alpha_k l_k (3 - alpha_k^2 l_k^2) / 2: small eigenvalues grow by up to 3*sqrt(3)/2 = 2.6
per step instead of 1.5, and alpha_k -> 1 (plain Newton–Schulz) as l_k -> 1. The alphas depend
only on l_0, so they are computed on the host with no device sync. l_0 comes from ``cond_max``,
an assumed bound on cond(A); if A is worse conditioned the iteration still converges (eigenvalues
below l_k still grow by alpha_k * 3/2 >= 1.5 per step), only in more iterations.

Scaling: s = min(||A||_F, ||A||_inf), both upper bounds on lambda_max for symmetric A, computed
on the device (no sync). Convergence check: ||P_k - I||_F / sqrt(n) is computed on the device
every iteration into a buffer that is read back once after the planned growth phase and then once
every ``check_every`` iterations (a handful of host syncs per call, not one per iteration).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .errors import ConvergenceError

# Default accepted residual ||X A X - I||_F / sqrt(n). The attainable residual is about
# cond(A) * eps (the eigh path reaches the same floor), so these accept cond up to ~1e11 (fp64)
# and ~3e5 (fp32); see scripts/results/newton_schulz.md for the measured table.
DEFAULT_TOL = {torch.float64: 1e-6, torch.float32: 1e-3}
# Default assumed bound on cond(A) (sets l_0; a worse conditioned A only costs iterations).
DEFAULT_COND_MAX = {torch.float64: 1e12, torch.float32: 1e7}


def chen_chow_alphas(l0: float, max_iter: int, scaled: bool = True):
    """Scaling factors alpha_k (k < max_iter) and the planned lower bounds l_k of the sign spectrum."""
    alphas, bounds, l = [], [], l0
    for _ in range(max_iter):
        a = math.sqrt(3.0 / (1.0 + l + l * l)) if scaled else 1.0
        alphas.append(a)
        bounds.append(l)
        l = min(1.0, 0.5 * a * l * (3.0 - a * a * l * l))
    return alphas, bounds


def residual(x: torch.Tensor, a: torch.Tensor, matmul: Callable = torch.matmul) -> float:
    """||X A X - I||_F / sqrt(n) in the working precision (two GEMMs, one host read)."""
    n = a.shape[-1]
    r = matmul(matmul(x, a), x)
    r.diagonal().sub_(1.0)
    return float(torch.linalg.matrix_norm(r) / math.sqrt(n))


def newton_schulz_inv_sqrt(
    a: torch.Tensor,
    *,
    matmul: Callable = torch.matmul,
    tol: float | None = None,
    max_iter: int = 100,
    check_every: int = 2,
    cond_max: float | None = None,
    scaled: bool = True,
    check: bool = True,
):
    """A^{-1/2} for SPD ``a`` (n, n) by the coupled (scaled) Newton–Schulz iteration.

    Runs until the iteration residual ||Z Y - I||_F / sqrt(n) reaches the rounding floor
    (<= 8 eps) or stops decreasing (stagnation: a step that fails to halve it once it is below
    1e-2), or max_iter. The first host read happens after the growth phase planned from
    ``cond_max`` (scaled) or after ``check_every`` steps (unscaled); later reads every
    ``check_every`` iterations. Then the true residual ||X A X - I||_F / sqrt(n) is computed
    (two extra GEMMs) and compared with ``tol`` (default DEFAULT_TOL[dtype]).

    converged = the iteration reached its floor (or stagnated there) and residual <= tol.
    check=True raises ConvergenceError when not converged; check=False returns (X, info) anyway.
    info: method, iterations, residual, residual_norm, iteration_residual, converged, stop,
    scale, scaled, tol, check_every, cond_max, host_syncs, dtype.
    """
    if a.ndim != 2 or a.shape[0] != a.shape[1]:
        raise ValueError(f"inv_sqrt_spd needs a square matrix, got shape {tuple(a.shape)}")
    if not a.is_floating_point():
        raise ValueError(f"inv_sqrt_spd needs a floating-point matrix, got {a.dtype}")
    n = a.shape[0]
    dtype = a.dtype
    tol = DEFAULT_TOL.get(dtype, 1e-3) if tol is None else float(tol)
    cond_max = DEFAULT_COND_MAX.get(dtype, 1e7) if cond_max is None else float(cond_max)
    check_every = max(1, int(check_every))
    max_iter = max(1, int(max_iter))
    # Any upper bound on lambda_max keeps the spectrum of A/s inside (0, 1].
    s = torch.minimum(torch.linalg.matrix_norm(a), a.abs().sum(dim=1).amax())
    # s / lambda_max <= sqrt(n) for both bounds, so lambda_min / s >= 1 / (cond * sqrt(n)).
    l0 = 1.0 / math.sqrt(cond_max * math.sqrt(n))
    alphas, bounds = chen_chow_alphas(l0, max_iter, scaled)
    grow = next((k for k, l in enumerate(bounds) if l > 0.9), max_iter) if scaled else 0
    first_check = min(max_iter, max(check_every, grow + 2))

    z, it, history, stop, syncs = _iterate(a, s, alphas, first_check, check_every, max_iter, matmul)
    x = z / torch.sqrt(s)
    res = residual(x, a, matmul) if stop != "diverged" else math.inf
    if not math.isfinite(res):
        res = math.inf
    converged = stop in ("floor", "stagnated") and res <= tol
    info = {
        "method": "newton_schulz",
        "iterations": it,
        "residual": res,
        "residual_norm": "||X A X - I||_F / sqrt(n)",
        "iteration_residual": history[-1],
        "converged": converged,
        "stop": stop,
        "scale": float(s),
        "scaled": scaled,
        "tol": tol,
        "check_every": check_every,
        "cond_max": cond_max,
        "host_syncs": syncs + 2,
        "dtype": str(dtype).replace("torch.", ""),
    }
    if check and not converged:
        raise _not_converged(info, n, max_iter)
    return x, info


def _iterate(a: torch.Tensor, s, alphas: list, first_check: int, check_every: int, max_iter: int, matmul: Callable):
    """The coupled iteration Y -> (A/s)^{1/2}, Z -> (A/s)^{-1/2} from Y = A/s, Z = I, with the
    step weights ``alphas``; the iteration residual is read on the host after ``first_check``
    steps, then every ``check_every``, and ``_stop`` says when to end. Returns (Z, iterations,
    residual history, stop reason, host syncs)."""
    n, dtype = a.shape[0], a.dtype
    eye = torch.eye(n, dtype=dtype, device=a.device)
    y = a / s
    z = eye.clone()
    res_buf = torch.empty(max_iter, dtype=torch.float64, device=a.device)
    inv_sqrt_n = 1.0 / math.sqrt(n)
    floor = 8.0 * torch.finfo(dtype).eps
    it, history, stop, syncs = 0, [], "max_iter", 0
    while it < max_iter and stop == "max_iter":
        chunk_end = min(max_iter, first_check if it == 0 else it + check_every)
        for k in range(it, chunk_end):
            al = alphas[k]
            p = matmul(z, y)
            res_buf[k] = torch.linalg.matrix_norm(p - eye) * inv_sqrt_n
            # T = (al/2) (3 I - al^2 P)
            t = p * (-0.5 * al**3)
            t.diagonal().add_(1.5 * al)
            y = matmul(y, t)
            z = matmul(t, z)
        history += res_buf[it:chunk_end].tolist()  # the one host sync of this chunk
        syncs += 1
        stop = _stop(history, it, chunk_end, floor)
        it = chunk_end
    return z, it, history, stop, syncs


def _stop(history: list, it: int, chunk_end: int, floor: float) -> str:
    """Why the iteration stops after the chunk of steps [it, chunk_end), or 'max_iter' to go on.
    Decided from the latest residuals only: the iterate is now at chunk_end (the scaled growth
    phase is not monotone, so early small values say nothing about the current one)."""
    chunk = history[it:chunk_end]
    last, prev = history[-1], (history[-2] if len(history) > 1 else math.inf)
    if not all(math.isfinite(r) and r <= 1e6 for r in chunk):
        return "diverged"
    if last <= floor:
        return "floor"
    if prev < 1e-2 and last > 0.5 * prev:
        return "stagnated"
    return "max_iter"


def _not_converged(info: dict, n: int, max_iter: int) -> ConvergenceError:
    """The error of an iteration that did not converge (``info`` of newton_schulz_inv_sqrt)."""
    why = {
        "diverged": "the iteration diverged (the matrix is not SPD?)",
        "max_iter": f"max_iter={max_iter} reached",
    }.get(info["stop"], "the residual is above tol: the matrix is too ill-conditioned for this precision")
    return ConvergenceError(
        f"Newton–Schulz A^-1/2 did not converge for n={n} in {info['dtype']}: {why}; "
        f"residual ||XAX-I||_F/sqrt(n) = {info['residual']:.3e}, tol {info['tol']:.1e}, {info['iterations']} "
        "iterations. Use method='eigh', fp64, a larger tol, or check=False to accept the result"
    )
