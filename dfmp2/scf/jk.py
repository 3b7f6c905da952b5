"""The JK factor of our DF-SCF and the J and K builds over it (where the K build is).

Host (PySCF, fp64, O(N^2) or one-off): the overlap S, hcore (``pyscf.scf.hf.get_hcore``, so
ECPs and ghost atoms come with it), E_nuc, the initial guess (PySCF's default 'minao', so the
iteration counts compare), and the raw integrals (P|Q) and packed (μν|P) (dfmp2.df.integrals) over
the JK-fit set ``dfmp2.df.basis.default_auxbasis(mol, 'jk')``, exactly PySCF's DF-RHF's.

Device (linalg, the heavy part):
    JK factor  B = L^-1 (P|μν), L L^T = (P|Q) (one right-side TRSM of the whole raw factor), kept
               resident unpacked (naux, nao, nao) where the memory plan has room, else packed μ >= ν
               (naux, nao(nao+1)/2)
    unpacked   per block of P (UNPACKED_BLOCK_MB): Z = C^T B_P (one GEMM), K's lower triangle += Z^T Z
               (one GEMM per block row, in place), γ_P from the same Z, J += Σ_P γ_P B_P (``JKFactor.jk``)
    packed     J:  γ = B d,  J = unpack(B^T γ)   d = packed D, off-diagonal elements doubled (two GEMMs)
               K:  per block of P, the block unpacked, then Z and K as above; D = C C^T (columns
               scaled by the occupation)
Dense O(N^3) algebra (canonical orthogonalisation, Fock diagonalisation, density, commutator,
DIIS) in fp64: on the device where it has fp64, on the host where it has not (Trainium; recorded
in ``ran['scf']['host_kernels']``).

Shapes: the factor is (naux, nao(nao+1)/2) packed or (naux, nao, nao) unpacked (``JKFactor``; the
layout 'unpacked', ``unpacked``, and a mixed SCF's fp32 copy, ``fp32_unpacked``), densities and J, K
(nao, nao), Hartree. Exchange blocks of ``jk_block`` auxiliary functions, near JK_BLOCK_MB MB
unpacked (UNPACKED_BLOCK_MB over the unpacked factor). ``build_jk_factor``
fits the factor (the split one over ranks: dfmp2.scf.jk_dist). DFRHF (dfmp2.scf.rhf), DFUHF
(dfmp2.scf.uhf) and the gradient's response (dfmp2.grad) build their J and K here.
"""

from __future__ import annotations

import time

import torch

from dfmp2 import distributed, linalg
from dfmp2.df import integrals
from dfmp2.df.fitting import apply_metric, describe_metric, fit_metric
from dfmp2.linalg import torch_ops
from dfmp2.scf import jk_dist

JK_BLOCK_MB = 64.0  # target MB of one unpacked factor block in the exchange build
UNPACKED_BLOCK_MB = 16.0  # the same over the unpacked factor (JKFactor.jk): J's GEMV re-reads the block
# its K GEMMs just read, so it should still be in the last-level cache
LAYOUTS = ("packed", "unpacked")


def npair(nao: int) -> int:
    return nao * (nao + 1) // 2


def jk_block(nao: int, naux: int, itemsize: int, block_mb: float = JK_BLOCK_MB) -> int:
    """Auxiliary functions per exchange block: the unpacked block (nb, nao, nao) near block_mb."""
    return max(1, min(naux, int(block_mb * 1e6 // max(1, nao * nao * itemsize))))


class JKFactor:
    """The fitted JK factor B on the backend's device in ``dtype``: packed (naux, nao(nao+1)/2),
    μ >= ν in PySCF's order, or unpacked (naux, nao, nao) (``packed`` False: the memory plan's
    layout 'unpacked', and the mixed SCF's fp32 copy); J and K of a density from it (see the
    module docstring). The unpacked layout costs twice the memory and saves the per-cycle unpack:
    its exchange blocks are views, and ``jk`` builds J and K in one pass over it."""

    def __init__(self, B: torch.Tensor, nao: int, backend, block: int, metric: str):
        self.B, self.nao, self.backend, self.block, self.metric = B, nao, backend, block, metric
        if self.packed:
            r, c = torch.tril_indices(nao, nao, device=B.device)
            self.lower = r * nao + c  # flat index of (μ, ν), μ >= ν
            self.offdiag_weight = torch.where(r == c, 1.0, 2.0).to(dtype=B.dtype)

    @property
    def naux(self) -> int:
        return self.B.shape[0]

    @property
    def packed(self) -> bool:
        return self.B.dim() == 2

    @property
    def layout(self) -> str:
        return "packed" if self.packed else "unpacked"

    def pack(self, D: torch.Tensor) -> torch.Tensor:
        """(nao, nao) symmetric -> (npair,) lower triangle with off-diagonal elements doubled."""
        return D.reshape(-1)[self.lower].to(self.B.dtype) * self.offdiag_weight

    def unpack(self, p: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """(..., npair) -> (..., nao, nao) symmetric (a layout step, no arithmetic):
        ``dfmp2.df.integrals.unpack``, into ``out`` when given."""
        return integrals.unpack(p, self.nao, out=out)

    def coulomb(self, D: torch.Tensor) -> torch.Tensor:
        """J(D)_μν = Σ_λσ (μν|λσ) D_λσ (nao, nao) in the factor's dtype: two GEMMs (matrix-vector)
        over the packed factor (D packed, off-diagonal doubled) or the unpacked one (D flat)."""
        be, nao = self.backend, self.nao
        B = self.B if self.packed else self.B.view(self.naux, nao * nao)
        d = self.pack(D) if self.packed else D.reshape(-1).to(B.dtype)
        gamma = linalg.gemm(B, d[:, None], backend=be)  # (naux, 1)
        jp = linalg.gemm(B, gamma, trans_a=True, backend=be)[:, 0]  # (npair,) or (nao^2,)
        return self.unpack(jp) if self.packed else jp.view(nao, nao)

    def exchange(self, C: torch.Tensor, split: int | None = None) -> torch.Tensor:
        """K(D)_μν = Σ_λσ (μλ|νσ) D_λσ for D = C[:, :split] C[:, :split]^T - C[:, split:] C[:, split:]^T
        (split None: D = C C^T). C (nao, m); returns (nao, nao) fp64 (an fp32 factor's blocks are
        summed in fp64). Per block of P: Z = C^T B_P (one GEMM), K += Z^T Z (``_syrk_into``)."""
        nao, packed = self.nao, self.packed
        Cd = C.to(self.B.dtype)
        K = torch.zeros((nao, nao), dtype=torch.float64, device=self.B.device)
        if packed:
            buf = torch.empty((min(self.block, self.naux), nao * nao), dtype=self.B.dtype, device=self.B.device)
        for p0 in range(0, self.naux, self.block):
            p1 = min(self.naux, p0 + self.block)
            Bf = self.unpack(self.B[p0:p1], out=buf[: p1 - p0]) if packed else self.B[p0:p1]
            self._exchange_block(K, Cd, Bf.reshape((p1 - p0) * nao, nao), split)
        return _mirror(K)

    def _exchange_block(self, K, Cd, Bf, split, sign=None):
        """K's lower triangle += Z^T Z (split: minus for the columns from ``split`` on) with
        Z = Cd^T B_P of one block Bf ((nb nao, nao), its P's unpacked). With ``sign`` (m,) returns
        γ_P = Σ_i sign_i (C^T B_P C)_ii (nb,) = Σ_λσ B_Pλσ D_λσ (a batched GEMV of Z)."""
        be, nao, m = self.backend, self.nao, Cd.shape[1]
        nb = Bf.shape[0] // nao
        Z = linalg.gemm(Cd, Bf, trans_a=True, trans_b=True, backend=be).reshape(m, nb, nao)  # (m, nb*nao)
        if split is None:
            _syrk_into(K, Z.reshape(m * nb, nao), 1.0, be)
        else:
            if split > 0:
                _syrk_into(K, Z[:split].reshape(split * nb, nao), 1.0, be)
            if split < m:
                _syrk_into(K, Z[split:].reshape((m - split) * nb, nao), -1.0, be)
        if sign is not None:  # (m, nb, nao) @ (m, nao, 1): each i's trace, summed over i in fp64
            return torch.bmm(Z, (Cd * sign).mT[:, :, None])[:, :, 0].to(torch.float64).sum(0)
        return None

    def jk(self, factors) -> tuple[torch.Tensor, torch.Tensor]:
        """(J, K) of the unpacked factor in one pass over it: J (nao, nao) of D = Σ_f D_f and K
        (nfactor, nao, nao) of each D_f, fp64, for ``factors`` [(C_f (nao, m_f), split_f)] with
        D_f = C_f[:, :split] C_f[:, :split]^T - C_f[:, split:] C_f[:, split:]^T (as ``exchange``).
        Per block of P, with its K GEMMs: γ_P = Σ_f Σ_i ±(C_f^T B_P C_f)_ii from the same Z (no
        pass over the factor for γ) and J += Σ_P γ_P B_P while the block is in cache (one GEMV)."""
        if self.packed:
            raise ValueError("the one-pass J/K needs the unpacked factor")
        nao, dt, dev = self.nao, self.B.dtype, self.B.device
        K = torch.zeros((len(factors), nao, nao), dtype=torch.float64, device=dev)
        J = torch.zeros((1, nao * nao), dtype=torch.float64, device=dev)
        cols = []
        for C, split in factors:
            sign = torch.ones(C.shape[1], dtype=dt, device=dev)
            if split is not None:
                sign[split:] = -1.0
            cols.append((C.to(dt), split, sign))
        for p0 in range(0, self.naux, self.block):
            p1 = min(self.naux, p0 + self.block)
            Bb = self.B[p0:p1]
            gamma = torch.zeros(p1 - p0, dtype=torch.float64, device=dev)
            for k, (Cd, split, sign) in enumerate(cols):
                if Cd.shape[1]:
                    gamma += self._exchange_block(K[k], Cd, Bb.reshape(-1, nao), split, sign)
            if dt == torch.float64:
                linalg.gemm(gamma[None, :], Bb.reshape(p1 - p0, nao * nao), beta=1.0, out=J, backend=self.backend)
            else:  # an fp32 factor: each block's short sum over P in fp32, the blocks summed in fp64
                Jb = linalg.gemm(gamma.to(dt)[None, :], Bb.reshape(p1 - p0, nao * nao), backend=self.backend)
                J += Jb.to(J.dtype)
        return J.view(nao, nao).to(torch.float64), torch.stack([_mirror(k) for k in K])


def _syrk_into(K: torch.Tensor, Z: torch.Tensor, alpha: float, backend) -> None:
    """K's lower triangle += alpha Z^T Z, Z (k, n), K (n, n) fp64 (its strict upper part is not
    kept). An fp64 Z: block row I of the triangle by one GEMM into K's view, accumulated in place
    (linalg.torch_ops.syrk_blocks; no temporary and no mirror per call, ``_mirror`` once). An fp32
    Z (a device without fp64, a mixed SCF's copy): the backend's SYRK, summed in fp64."""
    if Z.dtype != K.dtype:
        K += alpha * linalg.syrk(Z, trans=True, backend=backend).to(K.dtype)
        return
    for r0, r1 in torch_ops.syrk_blocks(K.shape[0], Z.shape[0]):
        linalg.gemm(Z[:, r0:r1], Z[:, :r1], trans_a=True, alpha=alpha, beta=1.0, out=K[r0:r1, :r1], backend=backend)


def _mirror(K: torch.Tensor) -> torch.Tensor:
    """The symmetric (n, n) fp64 matrix of K's lower triangle (exactly symmetric)."""
    K = K.to(torch.float64).tril_()
    return K + K.tril(-1).mT


def fp32_unpacked(fac: JKFactor, block_mb: float = JK_BLOCK_MB) -> JKFactor:
    """The mixed SCF's fp32 copy of the fp64 factor, unpacked (naux, nao, nao): its exchange
    blocks are views, no unpack per cycle. Packed, the fp32 K was barely faster than fp64's on a
    CPU: the fp32 gather cost more than PySCF's C unpack in fp64 and ate most of what SGEMM + SSYRK
    saved (scripts/results/docstring-measurements.md); unpacked fp32 is the packed fp64 factor's size (nao^2 x 4 B
    against nao(nao+1)/2 x 8 B per function), counted in the memory plan. Only K uses it."""
    nao, naux = fac.nao, fac.naux
    B = torch.empty((naux, nao, nao), dtype=torch.float32, device=fac.B.device)
    step = jk_block(nao, naux, 8, block_mb)
    buf = torch.empty((min(step, naux), nao * nao), dtype=fac.B.dtype, device=fac.B.device) if fac.packed else None
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        B[p0:p1] = fac.unpack(fac.B[p0:p1], out=buf[: p1 - p0]) if fac.packed else fac.B[p0:p1]
    return JKFactor(B, nao, fac.backend, jk_block(nao, naux, 4, block_mb), fac.metric)


def unpacked(fac: JKFactor, block_mb: float = JK_BLOCK_MB) -> JKFactor:
    """The packed factor unpacked (naux, nao, nao) in its dtype and on its device, row block by row
    block (the packed one is dropped by the caller: both are resident until then), with exchange
    blocks of ``block_mb``."""
    nao, naux = fac.nao, fac.naux
    U = torch.empty((naux, nao, nao), dtype=fac.B.dtype, device=fac.B.device)
    step = jk_block(nao, naux, fac.B.element_size(), block_mb)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        fac.unpack(fac.B[p0:p1], out=U[p0:p1])
    return JKFactor(U, nao, fac.backend, jk_block(nao, naux, fac.B.element_size(), block_mb), fac.metric)


def build_jk_factor(
    mol,
    auxmol,
    backend,
    dtype,
    timer,
    block_mb: float = JK_BLOCK_MB,
    fit_backend=None,
    engine=None,
    world=None,
    layout: str = "packed",
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
    rows of the factor (dfmp2.scf.jk_dist.factor_rows). ``layout`` 'unpacked' (the memory plan's
    choice where the unpacked factor fits; ``driver.check_memory``): the factor on ``backend``
    unpacked (naux, nao, nao), exchange blocks of UNPACKED_BLOCK_MB (``JKFactor.jk``)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown JK factor layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    fb = fit_backend if fit_backend is not None else backend
    engine = engine or integrals.HostEngine(mol, fb)
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    itemsize = torch.finfo(dtype).bits // 8
    if world is not None and distributed.split_scf(world):
        B, kind, info, rows = jk_dist.factor_rows(mol, auxmol, fb, engine, block_mb, world, timer)
        out = _factor_from(B, nao, len(rows), backend, fb, dtype, itemsize, block_mb, describe_metric(kind, info))
        return _laid_out(out, layout, timer)
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
    B = _fit(M, kind, raw, fb)
    del raw, M
    out = _factor_from(B, nao, naux, backend, fb, dtype, itemsize, block_mb, describe_metric(kind, info))
    timer.add("scf_fit", t0)
    return _laid_out(out, layout, timer)


def _fit(M: torch.Tensor, kind: str, raw: torch.Tensor, backend) -> torch.Tensor:
    """``apply_metric`` of the whole raw factor (naux, npair), C-contiguous in and out. Cholesky:
    solved as B^T L^T = raw^T (a right-side TRSM of the transposed view), which LAPACK reads and
    writes in place of its column-major layout: the left-side solve of raw would cost a transposed
    copy of the factor in and one out (a second of memory traffic at (H2O)16/cc-pVDZ)."""
    if kind != "cholesky":
        return apply_metric(M, kind, raw, backend)
    return linalg.trsm(M, raw.mT, side="right", uplo="lower", trans=True, backend=backend).mT


def _laid_out(out, layout: str, timer):
    """(factor, fac64) of ``_factor_from`` with the factor in ``layout`` (the unpack timed as
    'scf_fit'; the packed one freed when nothing else holds it)."""
    fac, fac64 = out
    if layout == "packed":
        return fac, fac64
    t0 = time.perf_counter()
    fac = unpacked(fac, UNPACKED_BLOCK_MB)
    timer.add("scf_fit", t0)
    return fac, fac64


def _factor_from(B, nao: int, naux: int, backend, fb, dtype, itemsize: int, block_mb: float, metric: str):
    """(the JKFactor of the fp64 factor B on ``backend`` in ``dtype``, its fp64 one on ``fb`` or None)."""
    fac64 = None
    if dtype != torch.float64:
        fac64 = JKFactor(B, nao, fb, jk_block(nao, naux, 8, block_mb), metric)
    B = backend.to_device(B, dtype).contiguous()
    return JKFactor(B, nao, backend, jk_block(nao, naux, itemsize, block_mb), metric), fac64
