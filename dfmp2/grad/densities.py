"""The MP2 one-particle densities as a record (``MP2Densities``), in PySCF's conventions, for the
density stage (``dfmp2.grad.relaxed``) and the gradient stage (``GradientParts.densities``).

Conventions (those of ``pyscf.mp.dfmp2_native.DFMP2.make_rdm1`` and ``dfump2_native``): the MO
basis of the reference's canonical orbitals, total densities (the HF part included): RHF one
spin-summed matrix per kind (occupied diagonal 2 + the correlation part), UHF one per spin
(occupied diagonal 1 + that spin's part). ``unrelaxed``: the HF part and the correlation blocks
P_ij (active occupied) and P_ab (virtual) only; ``relaxed``: those with the orbital response
of the Z-vector (the occupied-virtual blocks and, with frozen core, the frozen-active block),
the derivative of the energy with respect to a one-electron perturbation (a field: dipoles).
Nothing here imports the stages (numpy only).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

KINDS = ("hf", "unrelaxed", "relaxed")


@dataclass
class MP2Densities:
    """One-particle densities of E_HF + c_os E_OS + c_ss E_SS (module docstring). Per spin channel
    (RHF: one, spin-summed; UHF: alpha, beta): ``mo_coeff`` (nao, nmo), ``nocc`` (occupied,
    frozen core included), ``unrelaxed`` and ``relaxed`` (nmo, nmo) in the MO basis, electrons
    per orbital pair (dimensionless; ``relaxed`` None when only the unrelaxed one was made);
    ``frozen`` (nmo,) bool, the orbitals left out of the correlation. ``zvector``: the Z-vector's
    iterations and relative residual; ``timings`` (s) and ``ran`` of the stage that made them."""

    restricted: bool
    mo_coeff: list
    nocc: list
    frozen: list
    unrelaxed: list
    relaxed: list | None = None
    c_os: float = 1.0
    c_ss: float = 1.0
    zvector: dict | None = None
    timings: dict = field(default_factory=dict)
    ran: dict = field(default_factory=dict)

    def hf(self) -> list:
        """The HF density per channel in the MO basis (nmo, nmo): 2 (RHF) or 1 (UHF) on the
        occupied diagonal."""
        occ = 2.0 if self.restricted else 1.0
        return [np.diag(np.where(np.arange(c.shape[1]) < n, occ, 0.0)) for c, n in zip(self.mo_coeff, self.nocc)]

    def mo(self, kind: str) -> list:
        """The ``kind`` ('hf', 'unrelaxed', 'relaxed') density per channel, MO basis (nmo, nmo)."""
        if kind not in KINDS:
            raise ValueError(f"unknown density kind {kind!r}; one of {', '.join(KINDS)}")
        out = self.hf() if kind == "hf" else getattr(self, kind)
        if out is None:
            raise ValueError("the relaxed density was not computed (relaxed=False)")
        return out

    def ao(self, kind: str) -> list:
        """The ``kind`` density per channel in the AO basis, C P C^T (nao, nao)."""
        return [c @ p @ c.T for c, p in zip(self.mo_coeff, self.mo(kind))]

    def total_ao(self, kind: str) -> np.ndarray:
        """The ``kind`` density of both spins together in the AO basis (nao, nao): what a
        one-electron property (a dipole: Σ D_μν r_νμ) contracts."""
        return sum(self.ao(kind))


def from_correlation(
    restricted: bool, mo_coeff: list, nocc: list, frozen: list, unrelaxed_corr: list, relaxed_corr: list | None, **kw
) -> MP2Densities:
    """The record of correlation parts (per channel (nmo, nmo), MO basis, without the HF part:
    the stages' P, symmetrised here) of the channels with ``mo_coeff`` (nao, nmo), ``nocc`` and
    ``frozen`` (nmo,) bool; the HF part is added here. ``kw``: c_os, c_ss, zvector, timings, ran."""
    C = [np.asarray(c, dtype=np.float64) for c in mo_coeff]
    fz = [np.asarray(f, dtype=bool) for f in frozen]
    rec = MP2Densities(restricted, C, [int(n) for n in nocc], fz, [], None, **kw)
    hf = rec.hf()
    rec.unrelaxed = [h + 0.5 * (p + p.T) for h, p in zip(hf, unrelaxed_corr)]
    if relaxed_corr is not None:
        rec.relaxed = [h + 0.5 * (p + p.T) for h, p in zip(hf, relaxed_corr)]
    return rec
