"""Test and benchmark data from Philox: random matrices, SPD matrices with a prescribed
condition number, and synthetic DF-MP2 problems (no chemistry needed).

Reproducibility: ``random_matrix`` and ``synthetic_problem`` are bit-identical on every device
for the same arguments: they are computed on the host (CPU) from Philox bits with exactly
specified float ops (see linalg.philox) and then copied to the device. ``random_spd`` needs a
QR factorisation and a GEMM, whose rounding depends on the BLAS, so it is always built on the
CPU in fp64 and then rounded to ``dtype`` and moved: bit-identical across devices on one
machine, equal to rounding across machines.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from . import philox as _philox
from .philox import normal, random_bits, uniform, words_for

# Streams (counter words c2, c3) that keep the independent parts of one seed apart.
_STREAM_MATRIX = 0
_STREAM_SPD = 1
_STREAM_EPS_OCC = 16
_STREAM_EPS_VIR = 17
_STREAM_B_SHARED = 18
_STREAM_B_PAIR = 19
_STREAM_B_SIGN = 20


def random_matrix(
    shape, seed: int, *, dtype=torch.float64, device="cpu", offset: int = 0, stream: int = _STREAM_MATRIX
) -> torch.Tensor:
    """Standard-normal matrix (any shape) from Philox normals; computed on the host and moved, so
    bit-identical on every device."""
    return normal(shape, seed, offset, stream=stream, dtype=dtype, device=device)


def spd_eigenvalues(n: int, cond: float, lmax: float = 1.0) -> torch.Tensor:
    """Geometrically spaced eigenvalues lmax * cond^(-k/(n-1)), k = 0..n-1 (fp64, descending)."""
    if cond < 1.0:
        raise ValueError(f"condition number must be >= 1, got {cond}")
    if n == 1:
        return torch.tensor([float(lmax)], dtype=torch.float64)
    k = torch.arange(n, dtype=torch.float64)
    return lmax * torch.exp(-math.log(cond) * k / (n - 1))


def random_spd(
    n: int, cond: float, seed: int, *, dtype=torch.float64, device="cpu", lmax: float = 1.0, return_eig: bool = False
):
    """SPD matrix Q diag(lambda) Q^T with eigenvalues spd_eigenvalues(n, cond, lmax).

    Q is the orthogonal factor of a Philox normal (n, n) matrix (signs fixed so diag(R) > 0).
    Built on the CPU in fp64 and exactly symmetrised, then rounded to ``dtype`` and moved, so the
    fp64 matrix has condition number cond to ~cond * 1e-16 relative; an fp32 copy only keeps the
    spectrum to ~6e-8 * lmax absolute (for cond >~ 1e8 the fp32 matrix may even be indefinite).
    return_eig=True returns (A, Q, lambda) with the fp64 CPU factors A was built from, so that
    exact functions of the intended matrix (e.g. Q diag(lambda^-1/2) Q^T) can serve as references.
    """
    g = normal((n, n), seed, stream=_STREAM_SPD, dtype=torch.float64, device="cpu")
    q, r = torch.linalg.qr(g)
    q = q * torch.sign(torch.diagonal(r))
    lam = spd_eigenvalues(n, cond, lmax)
    a = (q * lam) @ q.T
    a = 0.5 * (a + a.T)
    a = a.to(dtype).to(device)
    return (a, q, lam) if return_eig else a


@dataclass
class SyntheticProblem:
    """A synthetic DF-MP2 problem.

    B: (nocc, nvir, naux) fitted integrals B_ia^P; eps_occ (nocc,), eps_vir (nvir,) orbital energies
    in Hartree, ascending. ``e_target`` is the MP2 correlation energy (Hartree) the B scale was
    chosen for; the realised energy is within a few percent of it for all but tiny problems.
    """

    B: torch.Tensor
    eps_occ: torch.Tensor
    eps_vir: torch.Tensor
    seed: int
    e_target: float

    @property
    def nocc(self) -> int:
        return self.B.shape[0]

    @property
    def nvir(self) -> int:
        return self.B.shape[1]

    @property
    def naux(self) -> int:
        return self.B.shape[2]


def _laplace_sum(wo: np.ndarray, eo: np.ndarray, wv: np.ndarray, ev: np.ndarray) -> float:
    """S = sum_ijab wo_i wo_j wv_a wv_b / (eo_i + eo_j - ev_a - ev_b)  (all denominators < 0).

    Via 1/D = -int_0^inf exp(D t) dt, trapezoid rule in log t (converges exponentially):
    O((nocc + nvir) * nquad) instead of O(nocc^2 nvir^2).
    """
    s = np.linspace(-14.0, 6.0, 801)
    t = np.exp(s)
    fo = (wo[None, :] * np.exp(np.outer(t, eo))).sum(1)
    fv = (wv[None, :] * np.exp(-np.outer(t, ev))).sum(1)
    integrand = (fo * fv) ** 2 * t
    return -float(np.trapezoid(integrand, s) if hasattr(np, "trapezoid") else np.trapz(integrand, s))


def synthetic_problem(
    nocc: int,
    nvir: int,
    naux: int,
    seed: int,
    *,
    dtype=torch.float64,
    device="cpu",
    ecorr_per_occ: float = -0.03,
    exchange_fraction: float = 0.84,
) -> SyntheticProblem:
    """A synthetic DF-MP2 problem with chemically plausible magnitudes, for device comparisons and timing.

    Orbital energies (Hartree, ascending): occupied in [-20, -0.3] with most near the valence
    (HOMO = -0.3), virtuals in [0.1, 5] (LUMO = +0.1): HOMO–LUMO gap 0.4 Eh.
    B_iaP = sigma * w_i * v_a * g_P * (sqrt(c) s_iP C_aP + sqrt(1 - c) xi_iaP) with C, xi standard
    normal, s_iP = +-1 random signs, w_i = (1 + |eps_i|)^-1/2 (core orbitals correlate less),
    v_a = (1 + eps_a)^-1/2, g_P = (1 + 8 P / naux)^-1 (a decaying fitting spectrum).
    The shared part C correlates K_ab with K_ba (correlation c^2 for i != j), so same-spin is a
    fraction of opposite-spin as in real molecules (measured E_SS / E_OS ~ 0.15-0.25; i = j pairs
    have no same-spin part); the signs s_iP keep K_aa (i != j) from acquiring a mean. sigma is set
    from the expected energy (a Laplace-quadrature sum over the orbital energies plus the (ia|ia)
    diagonal term) so that E_MP2 ~ ecorr_per_occ * nocc (default -0.03 Eh per occupied orbital):
    measured E / e_target 0.93-1.22 for nocc * nvir >= 500; tiny problems fluctuate more.
    eps_occ and eps_vir are always fp64 (energies are carried in fp64); B has ``dtype``.

    Bit-identical on every device for the same arguments: B is computed on the host from Philox
    bits and normals in fp64, one occupied orbital at a time (B[i] uses words from offset
    i * words_for('normal', nvir * naux) of stream 19 and i * naux of stream 20), scaled with an
    exactly specified sequence of elementwise ops, rounded to ``dtype`` and copied to ``device``
    (a GPU's own elementwise kernels need not round as the CPU's do). Host memory: a few
    nvir * naux fp64 blocks; the whole B exists only on ``device``.
    """
    for name, v in (("nocc", nocc), ("nvir", nvir), ("naux", naux)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {v}")
    c = float(exchange_fraction)
    if not 0.0 <= c < 1.0:
        raise ValueError(f"exchange_fraction must be in [0, 1), got {c}")
    device = torch.device(device)

    # Orbital energies on the CPU (tiny), then moved.
    uo = uniform(nocc, seed, stream=_STREAM_EPS_OCC)
    eps_occ = -0.3 - 19.7 * uo**4
    eps_occ[torch.argmin(uo)] = -0.3  # HOMO pinned so the gap is exactly 0.4 Eh
    eps_occ, _ = torch.sort(eps_occ)
    uv = uniform(nvir, seed, stream=_STREAM_EPS_VIR)
    eps_vir = 0.1 + 4.9 * uv**2
    eps_vir[torch.argmin(uv)] = 0.1
    eps_vir, _ = torch.sort(eps_vir)

    w = (1.0 + eps_occ.abs()) ** -0.5
    v = (1.0 + eps_vir) ** -0.5
    g = 1.0 / (1.0 + 8.0 * torch.arange(naux, dtype=torch.float64) / naux)
    # E[K_ab^2] = sigma^4 w_i^2 w_j^2 v_a^2 v_b^2 sum_P g_P^4, E_SS ~ (1 - c^2) E_OS, plus the
    # squared mean of K_aa for i = j: (sigma^2 w_i^2 v_a^2 sum_P g_P^2)^2 over D = 2 (e_i - e_a).
    S = _laplace_sum((w**2).numpy(), eps_occ.numpy(), (v**2).numpy(), eps_vir.numpy())
    S_diag = float(((w**4)[:, None] * (v**4)[None, :] / (2.0 * (eps_occ[:, None] - eps_vir[None, :]))).sum())
    e_target = ecorr_per_occ * nocc
    G2, G4 = float((g**2).sum()), float((g**4).sum())
    sigma = (e_target / ((2.0 - c * c) * G4 * S + G2 * G2 * S_diag)) ** 0.25

    sg = sigma * g  # (naux,)
    wv = w[:, None] * v[None, :]  # (nocc, nvir)
    shared = normal((nvir, naux), seed, stream=_STREAM_B_SHARED) * math.sqrt(c)
    B = torch.empty((nocc, nvir, naux), dtype=dtype, device=device)
    per_i = words_for("normal", nvir * naux)
    for i in range(nocc):  # on the host, then one copy per orbital
        xi = normal((nvir, naux), seed, i * per_i, stream=_STREAM_B_PAIR)
        sign = 1.0 - 2.0 * (random_bits(naux, seed, i * naux, stream=_STREAM_B_SIGN) & 1).to(torch.float64)
        bi = (xi * math.sqrt(1.0 - c) + shared * sign) * sg
        B[i].copy_((bi * wv[i][:, None]).to(dtype))
    return SyntheticProblem(
        B=B, eps_occ=eps_occ.to(device), eps_vir=eps_vir.to(device), seed=int(seed), e_target=e_target
    )


# The generators built on Philox are also reachable as linalg.philox.<name>. They are set on philox
# from here, the upper module, so that philox imports nothing of this one (no import cycle).
for _name in ("random_matrix", "random_spd", "synthetic_problem", "SyntheticProblem"):
    setattr(_philox, _name, globals()[_name])
del _name
