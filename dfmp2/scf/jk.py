"""The JK factor of our DF-SCF and the J and K builds over it (where the K build is).

Host (PySCF, fp64, O(N^2) or one-off): the overlap S, hcore (``pyscf.scf.hf.get_hcore``, so
ECPs and ghost atoms come with it), E_nuc, the initial guess (PySCF's default 'minao', so the
iteration counts compare), and the raw integrals (P|Q) and packed (μν|P) (dfmp2.df.integrals) over
the JK-fit set ``dfmp2.df.basis.default_auxbasis(mol, 'jk')``, exactly PySCF's DF-RHF's.

Device (linalg, the heavy part):
    JK factor  B = L^-1 (P|μν), L L^T = (P|Q), packed μ >= ν: (naux, nao(nao+1)/2), kept resident
    J:  γ = B d,  J = unpack(B^T γ)        d = packed D, off-diagonal elements doubled (two GEMMs)
    K:  per block of P, Z[(i,P), μ] = Σ_ν C_νi B_Pμν  (one GEMM on the unpacked block),
        K += Z^T Z                         (SYRK); D = C C^T (columns scaled by the occupation)
Dense O(N^3) algebra (canonical orthogonalisation, Fock diagonalisation, density, commutator,
DIIS) in fp64: on the device where it has fp64, on the host where it has not (Trainium; recorded
in ``ran['scf']['host_kernels']``).

Shapes: the factor is (naux, nao(nao+1)/2) packed (``JKFactor``; unpacked (naux, nao, nao) for a
mixed SCF's fp32 copy, ``fp32_unpacked``), densities and J, K (nao, nao), Hartree. Exchange
blocks of ``jk_block`` auxiliary functions, near JK_BLOCK_MB MB unpacked. ``build_jk_factor``
fits the factor (the split one over ranks: dfmp2.scf.jk_dist). DFRHF (dfmp2.scf.rhf), DFUHF
(dfmp2.scf.uhf) and the gradient's response (dfmp2.grad) build their J and K here.
"""

from __future__ import annotations

import time

import torch

from dfmp2 import distributed, linalg
from dfmp2.df import integrals
from dfmp2.df.fitting import apply_metric, describe_metric, fit_metric
from dfmp2.scf import jk_dist

JK_BLOCK_MB = 64.0  # target MB of one unpacked factor block in the exchange build


def npair(nao: int) -> int:
    return nao * (nao + 1) // 2


def jk_block(nao: int, naux: int, itemsize: int, block_mb: float = JK_BLOCK_MB) -> int:
    """Auxiliary functions per exchange block: the unpacked block (nb, nao, nao) near block_mb."""
    return max(1, min(naux, int(block_mb * 1e6 // max(1, nao * nao * itemsize))))


class JKFactor:
    """The fitted JK factor B (naux, nao(nao+1)/2), packed μ >= ν in PySCF's order, on the
    backend's device in ``dtype``; J and K of a density from it (see the module docstring).
    B (naux, nao, nao), unpacked (``fp32_unpacked``): K only, its blocks are views."""

    def __init__(self, B: torch.Tensor, nao: int, backend, block: int, metric: str):
        self.B, self.nao, self.backend, self.block, self.metric = B, nao, backend, block, metric
        r, c = torch.tril_indices(nao, nao, device=B.device)
        self.lower = r * nao + c  # flat index of (μ, ν), μ >= ν
        self.offdiag_weight = torch.where(r == c, 1.0, 2.0).to(dtype=B.dtype)

    @property
    def naux(self) -> int:
        return self.B.shape[0]

    def pack(self, D: torch.Tensor) -> torch.Tensor:
        """(nao, nao) symmetric -> (npair,) lower triangle with off-diagonal elements doubled."""
        return D.reshape(-1)[self.lower].to(self.B.dtype) * self.offdiag_weight

    def unpack(self, p: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(..., npair) -> (..., nao, nao) symmetric (a layout step, no arithmetic):
        ``dfmp2.df.integrals.unpack``, into ``out`` when given."""
        return integrals.unpack(p, self.nao, out=out)

    def coulomb(self, D: torch.Tensor) -> torch.Tensor:
        """J(D)_μν = Σ_λσ (μν|λσ) D_λσ (nao, nao) in the factor's dtype: two GEMMs (matrix-vector)."""
        if self.B.dim() != 2:
            raise ValueError("J needs the packed factor")
        be = self.backend
        gamma = linalg.gemm(self.B, self.pack(D)[:, None], backend=be)  # (naux, 1)
        jp = linalg.gemm(self.B, gamma, trans_a=True, backend=be)  # (npair, 1)
        return self.unpack(jp[:, 0])

    def exchange(self, C: torch.Tensor, split: int | None = None) -> torch.Tensor:
        """K(D)_μν = Σ_λσ (μλ|νσ) D_λσ for D = C[:, :split] C[:, :split]^T - C[:, split:] C[:, split:]^T
        (split None: D = C C^T). C (nao, m); returns (nao, nao) fp64 (the blocks' SYRKs are summed
        in fp64). Per block of P: Z = C^T B_P (one GEMM), K += Z^T Z (SYRK)."""
        be, nao, m, packed = self.backend, self.nao, C.shape[1], self.B.dim() == 2
        Cd = C.to(self.B.dtype)
        K = torch.zeros((nao, nao), dtype=torch.float64, device=self.B.device)
        if packed:
            buf = torch.empty((min(self.block, self.naux), nao * nao), dtype=self.B.dtype, device=self.B.device)
        for p0 in range(0, self.naux, self.block):
            p1 = min(self.naux, p0 + self.block)
            nb = p1 - p0
            Bf = (self.unpack(self.B[p0:p1], out=buf[:nb]) if packed else self.B[p0:p1]).reshape(nb * nao, nao)
            Z = linalg.gemm(Cd, Bf, trans_a=True, trans_b=True, backend=be)  # (m, nb*nao)
            Z = Z.reshape(m, nb, nao)
            if split is None:
                K += linalg.syrk(Z.reshape(m * nb, nao), trans=True, backend=be).to(torch.float64)
            else:
                if split > 0:
                    K += linalg.syrk(Z[:split].reshape(split * nb, nao), trans=True, backend=be).to(torch.float64)
                if split < m:
                    K -= linalg.syrk(Z[split:].reshape((m - split) * nb, nao), trans=True, backend=be).to(torch.float64)
        return K


def fp32_unpacked(fac: JKFactor, block_mb: float = JK_BLOCK_MB) -> JKFactor:
    """The mixed SCF's fp32 copy of the fp64 factor, unpacked (naux, nao, nao): its exchange
    blocks are views, no unpack per cycle. Packed, the fp32 K was barely faster than fp64's on a
    CPU: the fp32 gather cost more than PySCF's C unpack in fp64 and ate most of what SGEMM + SSYRK
    saved (scripts/results/docstring-measurements.md); unpacked fp32 is the packed fp64 factor's size (nao^2 x 4 B
    against nao(nao+1)/2 x 8 B per function), counted in the memory plan. Only K uses it."""
    nao, naux = fac.nao, fac.naux
    B = torch.empty((naux, nao, nao), dtype=torch.float32, device=fac.B.device)
    step = jk_block(nao, naux, 8, block_mb)
    buf = torch.empty((min(step, naux), nao * nao), dtype=fac.B.dtype, device=fac.B.device)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        B[p0:p1] = fac.unpack(fac.B[p0:p1], out=buf[: p1 - p0])
    return JKFactor(B, nao, fac.backend, jk_block(nao, naux, 4, block_mb), fac.metric)


def build_jk_factor(
    mol, auxmol, backend, dtype, timer, block_mb: float = JK_BLOCK_MB, fit_backend=None, engine=None, world=None
) -> tuple[JKFactor, JKFactor | None]:
    """Fit the packed 3-center integrals: B = L^-1 (P|μν) (Cholesky of the metric; eigh, j2c^-1/2,
    when it is not positive definite), streamed in aux-shell blocks from the integral engine
    ``engine`` (dfmp2.df.integrals, as the MP2 stage's; default: the host engine, libcint in a
    background thread), fitted in fp64 on ``fit_backend`` (default: ``backend``), then kept on
    ``backend`` in ``dtype``. Returns
    (factor on backend, the fp64 factor on fit_backend when ``dtype`` is not fp64, else None).

    The fit is fp64 even where the cycles are not: an fp32 solve amplifies rounding by the
    metric's conditioning (on water/cc-pVDZ-JKFIT it put E(HF) off by millihartrees), while B
    rounded to fp32 after an fp64 fit keeps about fp32's own relative error (scripts/results/docstring-measurements.md).
    ``world`` over several ranks with the split SCF (dfmp2.distributed.split_scf): this rank's
    rows of the factor (dfmp2.scf.jk_dist.factor_rows)."""
    fb = fit_backend if fit_backend is not None else backend
    engine = engine or integrals.HostEngine(mol, fb)
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    itemsize = torch.finfo(dtype).bits // 8
    if world is not None and distributed.split_scf(world):
        B, kind, info, rows = jk_dist.factor_rows(mol, auxmol, fb, engine, block_mb, world, timer)
        return _factor_from(B, nao, len(rows), backend, fb, dtype, itemsize, block_mb, describe_metric(kind, info))
    t0 = time.perf_counter()
    raw = fb.to_device(torch.empty((naux, npair(nao)), dtype=torch.float64))
    blocks = integrals.aux_shell_blocks(auxmol, max(1, int(block_mb * 1e6 // max(1, npair(nao) * 8))))
    with engine.blocks(auxmol, blocks, torch.float64) as stream:
        for p0, p1, packed in stream:
            raw[p0:p1] = packed.to(raw.device)
    j2c = engine.metric(auxmol).to(raw.device)
    t0 = timer.add("scf_integrals", t0)
    M, kind, info = fit_metric(j2c, fb)
    del j2c
    B = apply_metric(M, kind, raw, fb)
    del raw, M
    out = _factor_from(B, nao, naux, backend, fb, dtype, itemsize, block_mb, describe_metric(kind, info))
    timer.add("scf_fit", t0)
    return out


def _factor_from(B, nao: int, naux: int, backend, fb, dtype, itemsize: int, block_mb: float, metric: str):
    """(the JKFactor of the fp64 factor B on ``backend`` in ``dtype``, its fp64 one on ``fb`` or None)."""
    fac64 = None
    if dtype != torch.float64:
        fac64 = JKFactor(B, nao, fb, jk_block(nao, naux, 8, block_mb), metric)
    B = backend.to_device(B, dtype).contiguous()
    return JKFactor(B, nao, backend, jk_block(nao, naux, itemsize, block_mb), metric), fac64
