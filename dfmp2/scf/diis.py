"""Pulay's DIIS of our DF-SCF (``DIIS``), with its space and start cycle.

Convergence as PySCF's RHF with our thresholds (dfmp2.options.SCF_CONV_TOL, SCF_CONV_TOL_GRAD): Pulay DIIS
on F D S - S D F in the orthogonal basis from cycle 1, 8 vectors (its small solve scaled: DIIS;
fewer cycles than PySCF's on water clusters); converged when |ΔE| < 1e-12 Eh
and ||2 C_vir^T F C_occ|| < 1e-9; then one more diagonalisation and J/K build (PySCF's check).
The Fock matrices and error vectors it stores are (nao, nao) fp64, (2, nao, nao) stacked for the
DF-UHF (UHF_DIIS_SPACE of them); the small solve runs on the host (numpy).
"""

from __future__ import annotations

import numpy as np
import torch

DIIS_SPACE = 8  # PySCF's default diis_space
UHF_DIIS_SPACE = 16  # the DF-UHF's: 16 vectors rather than 8 save cycles on most open shells, the most
# where a hole delocalises softly ((H2O)8+), to the same E(UHF) (cycle counts:
# scripts/results/docstring-measurements.md); memory: 16 stacked (F, e) pairs,
# 4 nao^2 each (memory_mb)
DIIS_START_CYCLE = 1  # PySCF's default diis_start_cycle


class DIIS:
    """Pulay's DIIS (PySCF's lib.diis.DIIS): extrapolate Fock matrices with error vectors e_k,
    coefficients c minimising |Σ c_k e_k| under Σ c_k = 1 (eigen-solve of the small B matrix on
    the host, dropping |eigenvalue| < 1e-14 as PySCF does).

    ``scaled`` (the default): the error overlaps e_j.e_k are divided by their largest diagonal
    before the solve. The coefficients are the same in exact arithmetic (the constrained minimum
    does not depend on B's scale), but unscaled, once |e| < 1e-7 every eigenvalue of the error
    block is below PySCF's 1e-14 cut: the solve drops them and DIIS stops extrapolating, so the
    last decades of the gradient (1e-7 -> 1e-9) crawl. Scaled, water, benzene and water clusters
    converge in markedly fewer cycles to the same E(HF) (cycle counts:
    scripts/results/docstring-measurements.md). ``scaled=False`` is PySCF's solve."""

    def __init__(self, space: int = DIIS_SPACE, scaled: bool = True):
        self.space, self.F, self.e, self.noise, self.scaled = space, [], [], [], scaled

    def shift(self, dF: torch.Tensor) -> None:
        """Add ``dF`` to every stored Fock matrix (a correction common to all of them)."""
        self.F = [F + dF for F in self.F]

    def update(self, F: torch.Tensor, e: torch.Tensor, noise: float = 0.0) -> torch.Tensor:
        """The extrapolated Fock matrix, with (F, e) added. ``noise``: the error of F not seen
        in e (a mixed SCF's fp32 builds: their rounding); an entry is dropped once its noise is
        above the newest error's norm (it would pull the fp64 cycles back to it)."""
        self.F.append(F)
        self.e.append(e.reshape(-1))
        self.noise.append(noise)
        enorm = float(torch.linalg.norm(e))
        keep = [k for k in range(len(self.F) - 1) if self.noise[k] <= enorm][1 - self.space :] + [len(self.F) - 1]
        self.F, self.e, self.noise = ([x[k] for k in keep] for x in (self.F, self.e, self.noise))
        n = len(self.F)
        h = np.zeros((n + 1, n + 1))
        h[0, 1:] = h[1:, 0] = 1.0
        E = torch.stack(self.e)
        overlaps = (E @ E.mT).cpu().numpy()
        scale = overlaps.diagonal().max() if self.scaled else 1.0
        h[1:, 1:] = overlaps / (scale if scale > 0 else 1.0)
        g = np.zeros(n + 1)
        g[0] = 1.0
        w, v = np.linalg.eigh(h)
        keep = np.abs(w) > 1e-14
        c = v[:, keep] @ ((v[:, keep].T @ g) / w[keep])
        out = torch.zeros_like(F)
        for ck, Fk in zip(c[1:], self.F):
            out += float(ck) * Fk
        return out
