"""Our DF-RHF on the run's device, through ``linalg`` (``dfmp2 run --scf df``, the default).

A peer of the MP2 stage: it takes the backend, asks its capabilities and times itself with the
pipeline's timer. It returns the same ``scf.RHFReference`` the MP2 stage consumes (mf None).

Host (PySCF, fp64, O(N^2) or one-off): the overlap S, hcore (``pyscf.scf.hf.get_hcore``, so
ECPs and ghost atoms come with it), E_nuc, the initial guess (PySCF's default 'minao', so the
iteration counts compare), and the raw integrals (P|Q) and packed (μν|P) (dfmp2.df.integrals) over
the JK-fit set ``scf.default_auxbasis(mol, 'jk')``, exactly PySCF's DF-RHF's.

Device (linalg, the heavy part):
    JK factor  B = L^-1 (P|μν), L L^T = (P|Q), packed μ >= ν: (naux, nao(nao+1)/2), kept resident
    J:  γ = B d,  J = unpack(B^T γ)        d = packed D, off-diagonal elements doubled (two GEMMs)
    K:  per block of P, Z[(i,P), μ] = Σ_ν C_νi B_Pμν  (one GEMM on the unpacked block),
        K += Z^T Z                         (SYRK); D = C C^T (columns scaled by the occupation)
Dense O(N^3) algebra (canonical orthogonalisation, Fock diagonalisation, density, commutator,
DIIS) in fp64: on the device where it has fp64, on the host where it has not (Trainium; recorded
in ``ran['scf']['host_kernels']``).

Precision. fp64 devices build J and K of the whole density each cycle. A device without fp64
(trn, fp32 NKI GEMM/SYRK) builds the J and K of the density change ΔD = D_n - D_(n-1) and the
Fock matrix is accumulated in fp64 on the host (as the MP2 stage carries its sums): the fp32
noise then shrinks with ΔD and the SCF converges to the fp64 thresholds. ΔD = P - Q with P, Q
positive semidefinite of rank nocc, so its eigenvectors give K(ΔD) = K(V+ λ+^1/2) - K(V- |λ-|^1/2)
with at most nocc columns each (padded to nocc: one kernel shape). What stays is the fp32
rounding of the first build (the guess's J and K) and of the factor: see the module's tests
and scripts/results for the measured E(HF) difference to fp64. Where that perturbation stalls
the gradient (open shells with degenerate orbitals: OH), G is rebuilt once from the whole
density with the fp64 factor on the host and the fp32 cycles go on from there
(HOST_REBUILD_BELOW, recorded).

Mixed precision (``precision`` 'mixed', or 'auto' where the device has fp64 and fast fp32,
``resolve_precision``): the first cycles build K of the whole density from an fp32 copy of the
factor, J from the fp64 one, G summed into the Fock matrix in fp64 (nothing fp32 is carried from
cycle to cycle); once the orbital gradient nears the fp32 noise (FP32_NOISE, FP32_SWITCH) or
stalls (FP32_STALL) every later cycle is fp64, DIIS dropping the fp32 Fock matrices once the
error is below their noise, and the SCF converges to the same thresholds. Recorded in
``ScfRecord.cycle_precision``.

Open shells (``unrestricted``): DFUHF, the same factor and steps with two spin channels: J of
the total density, K per spin, one DIIS over both spins' stacked Fock matrices and commutators,
PySCF's UHF guess, <S^2> of the result (``reference.spin_square``). On a device without fp64 as
the RHF, with the host rebuild of G that open shells need (HOST_REBUILD_BELOW).

Convergence as PySCF's RHF with our thresholds (scf.SCF_CONV_TOL, SCF_CONV_TOL_GRAD): Pulay DIIS
on F D S - S D F in the orthogonal basis from cycle 1, 8 vectors (its small solve scaled: _DIIS;
about half PySCF's cycles on water clusters); converged when |ΔE| < 1e-12 Eh
and ||2 C_vir^T F C_occ|| < 1e-9; then one more diagonalisation and J/K build (PySCF's check).
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from pyscf.scf import hf as pyscf_hf
from pyscf.scf import uhf as pyscf_uhf

from dfmp2 import linalg

from dfmp2 import distributed
from dfmp2.scf import jk_dist as dfhf_dist
from dfmp2.df import integrals
from dfmp2.scf import pyscf_scf as scf
from dfmp2.scf import stability
from dfmp2.errors import InputError, MemoryLimitError
from dfmp2.df.fitting import apply_metric, describe_metric, fit_metric
from dfmp2.options import SCF_PRECISIONS
from dfmp2.provenance import ScfRecord, cycle_precision
from dfmp2.reference import Reference, project_density, restricted, spin_square, unrestricted
from dfmp2.timing import Timer

ENGINE = "dfmp2.scf.dfhf"
JK_BLOCK_MB = 64.0        # target MB of one unpacked factor block in the exchange build
DIIS_SPACE = 8            # PySCF's default diis_space
UHF_DIIS_SPACE = 16       # the DF-UHF's: cycles at 8 -> 16, E(UHF) the same to 1e-13 Eh: (H2O)8+ 72 -> 40 (its
                          # soft hole delocalisation), glycyl 33 -> 27, NO 24 -> 20, (H2O)4+ 24 -> 22, CN 21 -> 23,
                          # allyl 19 -> 20; memory: 16 stacked (F, e) pairs, 4 nao^2 each (memory_mb)
DIIS_START_CYCLE = 1      # PySCF's default diis_start_cycle
OPS = ("gemm", "syrk", "trsm", "cholesky", "eigh")   # the linalg ops this stage calls
DELTA_CUTOFF = 1e-13      # |eigenvalue| of ΔD below which its eigenvector is dropped (incremental builds)
# Mixed precision (fp64 devices with fast fp32): the cycles' K in fp32 until the orbital gradient
# nears the fp32 build's noise, then J/K in fp64 to the usual thresholds. J stays fp64 (two GEMVs,
# ~10% of a cycle): an fp32 J's long sums made 97% of the noise (benzene: gradient noise 3.8e-4
# with an fp32 J, 1.3e-5 without). Measured at converged densities, the gradient noise of an fp32
# K is 2.5 (H2O)4 to 7.5 (benzene) x eps32 ||K/2||_F (3e-6 to 1.3e-5); the energy's 1e-7 to 1e-5 Eh,
# first order and size-extensive, so a |ΔE| test would switch by chance: none is made.
FP32_NOISE = 20.0         # the gradient noise of an fp32 K, bounded: this many eps32 ||K/2||_F
FP32_SWITCH = 10.0        # J/K go to fp64 once the orbital gradient is below this many noises, ...
FP32_STALL = 0.8          # ... or falls by less than this factor in a cycle (at the noise floor)
# A device without fp64 (trn): J/K of ΔD in fp32 keep a fixed rounding perturbation in the Fock
# matrix (mostly the guess's build: the later ΔD are small). Open shells with degenerate partly
# filled orbitals (OH, NO: one pi electron in two pi orbitals) have a flat rotation between them,
# along which that perturbation moves the solution: OH's orbital gradient stalled at 1.8e-8
# (threshold 1e-9), then wandered up to 1e-4 (trn1 simulated, 60 cycles). So G is rebuilt from the
# whole density with the fp64 factor on the host (the factor the final energy uses anyway): the
# DF-UHF once its gradient first falls below UHF_PLANNED_REBUILD, and any SCF whose fp32 gradient
# stalls (FP32_STALL) below HOST_REBUILD_BELOW (not sooner than REBUILD_GRACE cycles after the
# last rebuild). The difference to the accumulated G is added to DIIS's stored Fock matrices too
# (the same perturbation is in all of them), and the fp32 cycles of ΔD go on from there on the
# device. Measured, trn1 simulated against CPU fp64, cycles (ours fp64 in brackets), 8 open-shell
# cases: OH 16 (16), NO 20 (20), CH2 18 (16), O2 24 (18), CN 23 (23), allyl 22 (20), H2O+ 18 (19),
# glycyl 27 (27), 1 to 3 host builds, |ΔE(UHF)| <= 2e-13 Eh, |Δ<S^2>| <= 5e-9. Without the planned
# rebuild (stalls only) 16 to 41 cycles; resetting DIIS at a rebuild instead of correcting it: up
# to 35. Recorded: cycle_precision (fp64_cycles: the host builds), the 'scf_fp64_host' time, the
# record's host line.
HOST_REBUILD_BELOW = 1e-5
UHF_PLANNED_REBUILD = 1e-3  # the DF-UHF's rebuild is planned: once, when the gradient first falls below this
REBUILD_GRACE = 3         # cycles after a rebuild before a stall counts (DIIS starts again from one vector)


def npair(nao: int) -> int:
    return nao * (nao + 1) // 2


def jk_block(nao: int, naux: int, itemsize: int, block_mb: float = JK_BLOCK_MB) -> int:
    """Auxiliary functions per exchange block: the unpacked block (nb, nao, nao) near block_mb."""
    return max(1, min(naux, int(block_mb * 1e6 // max(1, nao * nao * itemsize))))


def memory_mb(nao: int, naux: int, nocc: int, itemsize: int, block_mb: float = JK_BLOCK_MB,
              fp32_copy: bool = False, spins: int = 1) -> dict:
    """MB the SCF stage needs: 'factor' (the resident JK factor, naux nao(nao+1)/2 itemsize),
    'fp32_copy' (the mixed-precision SCF's fp32 copy of an fp64 factor, unpacked: naux nao^2 4 B,
    about the packed fp64 factor's size; or 0) and
    'peak': the fit (the raw integrals and the solution in fp64, and the factor in itemsize
    when that differs), or in the cycles the factor (and its fp64 copy for the final energy
    when itemsize is not 8, or its fp32 copy with ``fp32_copy``), one unpacked block and its
    half-transform (2 nocc columns at most; the spins' exchange builds run one after the other:
    nocc is the wider spin's); plus the dense nao x nao fp64 matrices, per spin (``spins`` 2 for
    the DF-UHF): about 8 (S, hcore, Fock, ...) and the DIIS history's Fock matrices and errors
    (DIIS_SPACE, UHF_DIIS_SPACE): 24 for RHF, 2 x 40 for UHF."""
    fac = naux * npair(nao) * itemsize
    fac64 = naux * npair(nao) * 8
    copy32 = naux * nao * nao * 4 if fp32_copy and itemsize == 8 else 0
    fit = 2 * fac64 + (fac if itemsize != 8 else 0)
    nb = jk_block(nao, naux, itemsize, block_mb)
    cycle = fac + (fac64 if itemsize != 8 else 0) + copy32 + nb * nao * nao * 8 + 2 * nb * nao * 2 * nocc * 8
    space = UHF_DIIS_SPACE if spins == 2 else DIIS_SPACE
    dense = (8 + 2 * space) * spins * nao * nao * 8
    return {"factor": fac / 1e6, "fp32_copy": copy32 / 1e6, "peak": (max(fit, cycle) + dense) / 1e6}


def check_memory(nao: int, naux: int, nocc: int, itemsize: int, limit_mb: float,
                 fp32_copy: bool = False, spins: int = 1) -> dict:
    """``memory_mb`` with the exchange block that fits ``limit_mb`` (JK_BLOCK_MB, else one
    auxiliary function per block), and that block as 'block_mb'; with ``fp32_copy`` (a mixed-
    precision SCF asks for it) each block first with the factor's fp32 copy, then without it
    ('fp32_copy' 0: the SCF then runs in fp64). MemoryLimitError (one line, before any integral) when even
    the smallest block without the copy does not fit. The factor stays in memory (no
    out-of-core SCF yet)."""
    for block_mb in (JK_BLOCK_MB, 1e-9):            # a smaller block would cost more than the copy saves
        for copy in ((True, False) if fp32_copy else (False,)):
            need = memory_mb(nao, naux, nocc, itemsize, block_mb, fp32_copy=copy, spins=spins)
            if need["peak"] <= limit_mb:
                return {**need, "block_mb": block_mb}
    raise MemoryLimitError(
        f"the DF-SCF needs about {need['peak']:.4g} MB (its JK factor alone {need['factor']:.4g} MB: "
        f"naux {naux} x nbasis {nao}({nao}+1)/2 x {itemsize} B) but the memory limit is "
        f"{limit_mb:.4g} MB; raise the memory limit, or use PySCF's DF-SCF (SCF mode 'pyscf-df')")


def resolve_precision(caps, requested: str, fp32_copy: bool = True) -> tuple[str, str]:
    """(mode, why) of the cycles' J/K on a device of capabilities ``caps`` for ``requested``
    (options.SCF_PRECISIONS): 'mixed' (fp32 J/K, then fp64), 'fp64', or 'fp32' (a device without
    fp64: J/K of ΔD in fp32, Fock summed in fp64, final energy with the fp64 factor on the host).
    'auto' is mixed where the device has fp64 and fast fp32 and memory allows the factor's fp32
    copy (``fp32_copy``). InputError for fp64 or mixed on a device without fp64."""
    if requested not in SCF_PRECISIONS:
        raise InputError(f"unknown SCF precision '{requested}'; use one of {', '.join(SCF_PRECISIONS)}",
                         option="scf_precision")
    if not caps.has_fp64:
        if requested != "auto":
            raise InputError(f"SCF precision {requested} needs fp64 arithmetic, which this device lacks; "
                             "use auto (fp32 J/K of the density change, Fock matrix in fp64)", option="scf_precision")
        return "fp32", "the device has no fp64: J/K of the density change in fp32, the Fock matrix summed in fp64"
    if requested == "fp64":
        return "fp64", "asked for"
    if requested == "auto" and not caps.fast_fp32:
        return "fp64", "auto: the device's fp32 is not faster than its fp64"
    if not fp32_copy:
        return "fp64", f"{requested}: the fp32 copy of the JK factor does not fit the memory limit"
    return "mixed", ("asked for" if requested == "mixed" else "auto: the device has fp64 and fast fp32")


class JKFactor:
    """The fitted JK factor B (naux, nao(nao+1)/2), packed μ >= ν in PySCF's order, on the
    backend's device in ``dtype``; J and K of a density from it (see the module docstring).
    B (naux, nao, nao), unpacked (``fp32_unpacked``): K only, its blocks are views."""

    def __init__(self, B: torch.Tensor, nao: int, backend, block: int, metric: str):
        self.B, self.nao, self.backend, self.block, self.metric = B, nao, backend, block, metric
        r, c = torch.tril_indices(nao, nao, device=B.device)
        self.lower = (r * nao + c)                       # flat index of (μ, ν), μ >= ν
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
        gamma = linalg.gemm(self.B, self.pack(D)[:, None], backend=be)              # (naux, 1)
        jp = linalg.gemm(self.B, gamma, trans_a=True, backend=be)                   # (npair, 1)
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
            Z = linalg.gemm(Cd, Bf, trans_a=True, trans_b=True, backend=be)         # (m, nb*nao)
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
    blocks are views, no unpack per cycle. Packed, the fp32 K was only 1.1x faster than fp64's on
    a CPU ((H2O)16: the fp32 gather 0.30 s against PySCF's C unpack in fp64 0.19 s, for SGEMM +
    SSYRK 0.27 s against 0.48 s); unpacked fp32 is the packed fp64 factor's size (nao^2 x 4 B
    against nao(nao+1)/2 x 8 B per function), counted in the memory plan. Only K uses it."""
    nao, naux = fac.nao, fac.naux
    B = torch.empty((naux, nao, nao), dtype=torch.float32, device=fac.B.device)
    step = jk_block(nao, naux, 8, block_mb)
    buf = torch.empty((min(step, naux), nao * nao), dtype=fac.B.dtype, device=fac.B.device)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        B[p0:p1] = fac.unpack(fac.B[p0:p1], out=buf[:p1 - p0])
    return JKFactor(B, nao, fac.backend, jk_block(nao, naux, 4, block_mb), fac.metric)


def build_jk_factor(mol, auxmol, backend, dtype, timer, block_mb: float = JK_BLOCK_MB,
                    fit_backend=None, engine=None, world=None) -> tuple[JKFactor, JKFactor | None]:
    """Fit the packed 3-center integrals: B = L^-1 (P|μν) (Cholesky of the metric; eigh, j2c^-1/2,
    when it is not positive definite), streamed in aux-shell blocks from the integral engine
    ``engine`` (dfmp2.df.integrals, as the MP2 stage's; default: the host engine, libcint in a
    background thread), fitted in fp64 on ``fit_backend`` (default: ``backend``), then kept on
    ``backend`` in ``dtype``. Returns
    (factor on backend, the fp64 factor on fit_backend when ``dtype`` is not fp64, else None).

    The fit is fp64 even where the cycles are not: an fp32 solve amplifies rounding by the
    metric's conditioning (measured on water/cc-pVDZ-JKFIT: B off by 1e-5 relative, E(HF) by
    5e-3 Eh), while B rounded to fp32 after an fp64 fit is off by 6e-8 relative.
    ``world`` over several ranks with the split SCF (dfmp2.distributed.split_scf): this rank's
    rows of the factor (dfmp2.scf.jk_dist.factor_rows)."""
    fb = fit_backend if fit_backend is not None else backend
    engine = engine or integrals.HostEngine(mol, fb)
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    itemsize = torch.finfo(dtype).bits // 8
    if world is not None and distributed.split_scf(world):
        B, kind, info, rows = dfhf_dist.factor_rows(mol, auxmol, fb, engine, block_mb, world, timer)
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


class _DIIS:
    """Pulay's DIIS (PySCF's lib.diis.DIIS): extrapolate Fock matrices with error vectors e_k,
    coefficients c minimising |Σ c_k e_k| under Σ c_k = 1 (eigen-solve of the small B matrix on
    the host, dropping |eigenvalue| < 1e-14 as PySCF does).

    ``scaled`` (the default): the error overlaps e_j.e_k are divided by their largest diagonal
    before the solve. The coefficients are the same in exact arithmetic (the constrained minimum
    does not depend on B's scale), but unscaled, once |e| < 1e-7 every eigenvalue of the error
    block is below PySCF's 1e-14 cut: the solve drops them and DIIS stops extrapolating, so the
    last decades of the gradient (1e-7 -> 1e-9) crawled over ~15 cycles. Measured (cycles,
    unscaled -> scaled, E(HF) the same to 5e-13 Eh): water 20 -> 13, benzene 16 -> 12, (H2O)4
    33 -> 17, (H2O)8 35 -> 18, (H2O)16 32 -> 18. ``scaled=False`` is PySCF's solve."""

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
        keep = [k for k in range(len(self.F) - 1) if self.noise[k] <= enorm][1 - self.space:] + [len(self.F) - 1]
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


def run_dfhf(mol, backend, *, max_cycle: int = scf.SCF_MAX_CYCLE, timer=None,
             block_mb: float = JK_BLOCK_MB, incremental: bool | None = None, engine=None,
             progress=None, conv_tol_grad: float = scf.SCF_CONV_TOL_GRAD, precision: str = "auto",
             fp32_copy: bool = True, unrestricted: bool = False, stability: bool = False,
             world=None, dm0=None) -> Reference:
    """Converge DF-RHF (DF-UHF with ``unrestricted``: two spin channels, DFUHF) on ``backend`` (see the module docstring). Returns the Reference (source
    'dfmp2.scf.dfhf', mo_coeff (nao, nmo) and mo_energy (nmo,) fp64 numpy) with its ScfRecord (device,
    precision, iterations, kernels of this stage, host work, times). SCFNotConvergedError when it
    does not converge in max_cycle cycles. ``incremental``: the Fock build (None: incremental
    exactly when the device lacks fp64). ``engine``: the integral engine for the JK-fit
    integrals (dfmp2.df.integrals; default: the host engine). ``progress(cycle, e_tot, d_e, gnorm,
    precision)`` after each cycle (timing.CycleLog prints it; precision: that cycle's J/K, 'fp32'
    or 'fp64'); ``conv_tol_grad``: the orbital-gradient threshold. ``precision``: the cycles'
    J/K, options.SCF_PRECISIONS ('auto': mixed where the device has fp64 and fast fp32);
    ``fp32_copy``: whether memory allows the mixed SCF's fp32 copy of the factor (the plan's
    ``check_memory``; False: fp64 cycles, recorded). ``stability`` (UHF): check the converged
    UHF's internal stability (DFUHF.run; recorded in ``ScfRecord.stability``). ``world``
    (dfmp2.distributed.World) over several ranks: the JK factor split by auxiliary index, J and
    K all-reduced each cycle (dfmp2.scf.jk_dist), unless the SCF is replicated
    (``distributed.split_scf``). ``dm0``: the density to start from (``DFRHF.given_density``;
    default PySCF's 'minao' guess)."""
    cls = DFUHF if unrestricted else DFRHF
    extra = {"check_stability": stability} if unrestricted else {}
    return cls(mol, backend, timer=timer or Timer(backend), block_mb=block_mb, **extra,
                 incremental=incremental, engine=engine, progress=progress,
                 conv_tol_grad=conv_tol_grad, precision=precision, fp32_copy=fp32_copy, world=world,
                 dm0=dm0).run(max_cycle)


class DFRHF:
    """Our DF-RHF, one step a method: the J/K build (``two_electron``, ``delta_factor``), the Fock
    matrix and its energy, diagonalisation, the density, DIIS and the convergence test. A DF-UHF
    overrides the spin-dependent ones (density, two_electron per spin) and keeps the rest.

    Dense O(N^3) algebra runs on ``dense``: the backend where it has fp64, else the host CPU."""

    reference = "RHF"
    diis_scaled = True        # False: PySCF's unscaled DIIS solve (see _DIIS)
    diis_space = DIIS_SPACE
    planned_rebuild = None    # on a device without fp64: rebuild G on the host once below this gradient
    jk_text = "J by GEMVs, K by GEMM + SYRK over the packed JK factor"

    def __init__(self, mol, backend, *, timer, block_mb: float = JK_BLOCK_MB,
                 incremental: bool | None = None, engine=None, progress=None,
                 conv_tol_grad: float = scf.SCF_CONV_TOL_GRAD, precision: str = "auto",
                 fp32_copy: bool = True, world=None, dm0=None):
        self.mol, self.backend, self.timer, self.conv_tol_grad = mol, backend, timer, conv_tol_grad
        self.dm0_given = dm0                    # a density to start from (``initial_density``), or None: 'minao'
        self.world = world if world is not None and distributed.split_scf(world) else distributed.World()
        self.progress = progress or (lambda *args: None)
        self.jk_dtype = backend.fit_dtype(backend.default_precision)     # fp64 where the device has it
        self.incremental = self.jk_dtype != torch.float64 if incremental is None else incremental
        self.requested, self.mode, self.why = precision, *resolve_precision(backend.caps, precision, fp32_copy)
        self.fp32_phase, self.fp32_cycles, self.switch = self.mode == "mixed", 0, None
        self.host_rebuild, self.host_builds = False, []    # G rebuilt in fp64 on the host: at these cycles
        self.built_on_host = False                         # this cycle's G was such a rebuild
        self.g_noise = 0.0           # the noise of the last G built (fp32: FP32_NOISE; not counted on trn)
        self.dense = backend if backend.has_fp64 else linalg.TorchBackend("cpu")
        self.kernels0, self.seconds0 = dict(backend.kernels_used), dict(timer.seconds)
        self.jk_spec = scf.default_auxbasis(mol, "jk")
        self.auxmol = scf.make_auxmol(mol, self.jk_spec)
        self.nao, self.nocc = mol.nao_nr(), max(mol.nelec)   # RHF: nelectron / 2
        self.engine = engine or integrals.HostEngine(mol, backend)
        self.fac, self.fac64 = build_jk_factor(mol, self.auxmol, backend, self.jk_dtype, timer, block_mb,
                                               fit_backend=self.dense, engine=self.engine, world=self.world)
        self.fac32 = fp32_unpacked(self.fac, block_mb) if self.mode == "mixed" else None
        self.t0 = time.perf_counter()
        self._one_electron()

    # ---- set-up: PySCF's one-electron part and guess, canonical orthogonalisation
    def _one_electron(self) -> None:
        todev, f64, mol = self.dense.to_device, torch.float64, self.mol
        self.S = todev(mol.intor_symmetric("int1e_ovlp"), f64)
        self.H = todev(pyscf_hf.get_hcore(mol), f64)
        self.e_nuc = float(mol.energy_nuc())
        self.dm0 = self.initial_density() if self.dm0_given is None else self.given_density(self.dm0_given)
        self.t0 = self.timer.add("scf_integrals", self.t0, sync=False)
        s, U = linalg.eigh(self.S, backend=self.dense)              # PySCF's cutoff on S's eigenvalues
        cutoff = scf.overlap_cutoff()
        keep = s > cutoff if cutoff is not None else torch.ones_like(s, dtype=torch.bool)
        self.X = U[:, keep] / torch.sqrt(s[keep])                    # (nao, nmo)

    def given_density(self, dm0):
        """A caller's starting density (the previous geometry's, ``Reference.density``): (nao, nao)
        for RHF, (2, nao, nao) for UHF, in this molecule's AO basis; when it carries its orbitals
        (``mo_coeff``, ``mo_occ``, PySCF's tag_array) they are re-orthonormalised in this geometry's
        overlap (``reference.project_density``). InputError on another shape."""
        want = self.density_shape()
        if tuple(np.shape(dm0)) != want:
            raise InputError(f"the starting density has shape {tuple(np.shape(dm0))}, this molecule's "
                             f"{self.reference} needs {want} (its basis has {self.nao} functions)")
        return project_density(dm0, self.S.cpu().numpy())           # S: _one_electron's, fp64

    def density_shape(self) -> tuple:
        return (self.nao, self.nao)

    @property
    def guess_name(self) -> str:
        return "minao (PySCF's default)" if self.dm0_given is None else "given density (a previous geometry's)"

    def initial_density(self):
        """PySCF's RHF default guess ('minao'), (nao, nao) numpy with its orbitals attached."""
        return pyscf_hf.init_guess_by_minao(self.mol)

    def guess(self):
        """(D, G) of the guess: 'minao' comes with its orbitals and (fractional) occupations."""
        D = self.dense.to_device(np.asarray(self.dm0), torch.float64)
        occ0 = getattr(self.dm0, "mo_occ", None)
        if occ0 is not None and np.all(np.asarray(occ0) >= 0):
            occ0 = np.asarray(occ0)
            Cg = self.dense.to_device(np.asarray(self.dm0.mo_coeff)[:, occ0 > 0] * np.sqrt(occ0[occ0 > 0]),
                                      torch.float64)
            return D, self.two_electron(D, Cg)
        return D, self.two_electron(D, *self.delta_factors(D, self.nao))

    # ---- J/K
    def two_electron(self, Dm, C, split=None, f=None):
        """G = J(Dm) - K(Dm)/2 (nao, nao) in fp64 on the dense device; Dm = C[:, :split] C^T - ... ."""
        f = f or self.cycle_factor()
        return self.coulomb(Dm, f) - self.exchange(f, [(C, split)], 0.5)[0]

    def coulomb(self, Dm, f):
        """J(Dm) (nao, nao) fp64 on the dense device; a mixed SCF's J stays fp64 (see FP32_NOISE)."""
        fj = self.fac if f is self.fac32 else f
        J = self.world.all_reduce_sum(fj.coulomb(Dm.to(fj.B.device)).to(torch.float64), "scf")
        return self.dense.to_device(J, torch.float64)

    def exchange(self, f, factors, scale: float):
        """scale K(C C^T) (nfactor, nao, nao) fp64 on the dense device, one per (C, split) of
        ``factors`` (JKFactor.exchange; C with no columns: zero). Sets ``g_noise``, the gradient
        noise of an fp32 K (what DIIS and the switch ask): FP32_NOISE eps32 ||scale K||_F."""
        K = torch.stack([f.exchange(C.to(f.B.device), split) if C.shape[1] else
                         torch.zeros((self.nao, self.nao), dtype=torch.float64, device=f.B.device)
                         for C, split in factors])
        K = self.world.all_reduce_sum(K, "scf") * scale         # over ranks: each holds some P
        if f is self.fac32:
            self.g_noise = FP32_NOISE * torch.finfo(torch.float32).eps * float(torch.linalg.norm(K))
        elif f.B.dtype == torch.float64:
            self.g_noise = 0.0
        return self.dense.to_device(K, torch.float64)

    def cycle_factor(self) -> JKFactor:
        """The factor of this cycle's J/K: the fp32 copy in a mixed SCF's fp32 phase, else ``fac``."""
        return self.fac32 if self.fp32_phase else self.fac

    @property
    def cycle_precision(self) -> str:
        if self.built_on_host:
            return "fp64"
        return str(self.cycle_factor().B.dtype).replace("torch.float", "fp")

    def delta_factor(self, dD, width=None):
        """(Cf, split) with dD = Cf[:, :split] Cf[:, :split]^T - Cf[:, split:] Cf[:, split:]^T,
        ``width`` (default nocc) columns each, zero-padded (one kernel shape) or widened when dD
        needs more, from the eigenvectors of dD (dense fp64). A difference of two rank-nocc
        densities has at most nocc of each sign; the first one, from the guess, may have more."""
        w, V = linalg.eigh(dD, backend=self.dense)
        pos = torch.nonzero(w > DELTA_CUTOFF).flatten()
        neg = torch.nonzero(w < -DELTA_CUTOFF).flatten()
        width = max(width or self.nocc, len(pos), len(neg))
        Cf = torch.zeros((self.nao, 2 * width), dtype=torch.float64, device=dD.device)
        Cf[:, :len(pos)] = V[:, pos] * torch.sqrt(w[pos])
        Cf[:, width:width + len(neg)] = V[:, neg] * torch.sqrt(-w[neg])
        return Cf, width

    def new_G(self, D, D_last, G, C, f=None):
        """G of the new density D: of ΔD added to G (incremental) or of the whole D. A mixed SCF's
        fp32 cycles build J/K of the whole D in fp32 (not of ΔD: K of ΔD takes 2 nocc columns, as
        many flops in fp32 as K of D in fp64), added to H in fp64: its rounding is not carried
        from cycle to cycle, and the fp64 cycles after the switch rebuild G from D."""
        self.built_on_host = self.host_rebuild and f is None
        if self.built_on_host:                             # G of D with the fp64 factor, on the host
            self.host_rebuild = False
            G_acc = G + self.two_electron(D - D_last, *self.delta_factors(D - D_last))
            t1 = time.perf_counter()
            G = self.two_electron(D, *self.occupied_factor(C), f=self.fac64)
            self.t0 -= self.timer.add("scf_fp64_host", t1, sync=False) - t1      # not charged to 'scf'
            self.diis.shift(G - G_acc)          # the accumulated rounding taken out of DIIS's Fock matrices too
            return G
        if self.incremental and f is None:
            return G + self.two_electron(D - D_last, *self.delta_factors(D - D_last))
        return self.two_electron(D, *self.occupied_factor(C), f=f)

    def occupied_factor(self, C):
        """(factor, split) of the density of orbitals C: D = 2 C_occ C_occ^T."""
        return math.sqrt(2.0) * C[:, :self.nocc], None

    def delta_factors(self, dD, width=None):
        """(factor, split) of a density change dD (``delta_factor``)."""
        return self.delta_factor(dD, width)

    # ---- dense steps
    def energy(self, Dm, G) -> float:
        return float((Dm * (self.H + 0.5 * G)).sum()) + self.e_nuc

    def diagonalize(self, F):
        dense, X = self.dense, self.X
        Fo = linalg.gemm(X, linalg.gemm(F, X, backend=dense), trans_a=True, backend=dense)
        e, V = linalg.eigh(Fo, backend=dense)
        return e, linalg.gemm(X, V, backend=dense)

    def density(self, C):
        return linalg.syrk(C[:, :self.nocc], alpha=2.0, backend=self.dense)

    def diis_error(self, F, D):
        """FDS - SDF in the orthogonal basis."""
        dense, X = self.dense, self.X
        FDS = linalg.gemm(F, linalg.gemm(D, self.S, backend=dense), backend=dense)
        return linalg.gemm(X, linalg.gemm(FDS - FDS.mT, X, backend=dense), trans_a=True, backend=dense)

    def orbital_gradient(self, F, C) -> float:
        """||2 C_vir^T F C_occ|| (PySCF's RHF get_grad)."""
        return 2.0 * self.gradient_norm(F, C, self.nocc)

    def gradient_norm(self, F, C, nocc: int) -> float:
        """||C_vir^T F C_occ||_F of one spin's Fock matrix F (nao, nao) and orbitals C (nao, nmo)."""
        g = linalg.gemm(C[:, nocc:], linalg.gemm(F, C[:, :nocc], backend=self.dense),
                        trans_a=True, backend=self.dense)
        return float(torch.linalg.norm(g))

    def converged(self, e_tot: float, e_last: float, gnorm: float) -> bool:
        return abs(e_tot - e_last) < scf.SCF_CONV_TOL and gnorm < self.conv_tol_grad

    # ---- the iterations
    def iterate(self, max_cycle: int):
        """Pulay DIIS from DIIS_START_CYCLE to convergence. Returns (cycles, D, G, F, e_tot)."""
        D, G = self.guess()
        e_tot = self.energy(D, G)
        diis = self.diis = _DIIS(self.diis_space, scaled=self.diis_scaled)
        for cycle in range(max_cycle):
            e_last, D_last = e_tot, D
            F = self.H + G
            if cycle >= DIIS_START_CYCLE:
                F = diis.update(F, self.diis_error(F, D), self.g_noise)
            _, C = self.diagonalize(F)
            D = self.density(C)
            G = self.new_G(D, D_last, G, C)
            e_tot = self.energy(D, G)
            F = self.H + G
            gnorm = self.orbital_gradient(F, C)
            self.progress(cycle + 1, e_tot, e_tot - e_last, gnorm, self.cycle_precision)
            if self.fp32_phase:
                self.fp32_cycles += 1
                self.maybe_switch(cycle + 1, e_tot - e_last, gnorm)
            elif self.converged(e_tot, e_last, gnorm):
                return cycle + 1, D, G, F
            else:
                self.maybe_host_rebuild(cycle + 1, e_tot - e_last, gnorm)
        raise scf.not_converged(self.reference, max_cycle, e_tot, e_tot - e_last, gnorm, self.conv_tol_grad)

    def maybe_switch(self, cycle: int, d_e: float, gnorm: float) -> bool:
        """End the fp32 phase once the orbital gradient nears the fp32 build's noise (below
        FP32_SWITCH noises, or stalled: FP32_STALL): the next cycle's J/K (of the whole density)
        are fp64. An fp32 cycle never ends the SCF: its Fock matrix is not the converged one.
        True when it switched."""
        last, self.last_gnorm = getattr(self, "last_gnorm", None), gnorm
        if gnorm < FP32_SWITCH * self.g_noise or (last is not None and gnorm > FP32_STALL * last):
            self.fp32_phase = False
            self.switch = {"cycle": cycle, "gnorm": gnorm, "d_e": d_e}
        return not self.fp32_phase

    def maybe_host_rebuild(self, cycle: int, d_e: float, gnorm: float) -> bool:
        """On a device without fp64: the next cycle's G is built from the whole density with the
        fp64 factor on the host once the incremental fp32 cycles' orbital gradient first falls
        below ``planned_rebuild`` (the DF-UHF's), or stalls (FP32_STALL) below HOST_REBUILD_BELOW
        (module constants). True when one is due (``host_builds`` records it)."""
        last, self.last_gnorm = getattr(self, "last_gnorm", None), gnorm
        grace = bool(self.host_builds) and cycle < self.host_builds[-1]["cycle"] + REBUILD_GRACE
        planned = self.planned_rebuild is not None and not self.host_builds and gnorm < self.planned_rebuild
        if (self.mode != "fp32" or not self.incremental or self.fac64 is None or grace
                or not (planned or (last is not None and gnorm < HOST_REBUILD_BELOW and gnorm > FP32_STALL * last))):
            return False
        self.host_rebuild = True
        self.host_builds.append({"cycle": cycle + 1, "gnorm_before": gnorm,
                                 "why": "planned (UHF_PLANNED_REBUILD)" if planned else "stalled (HOST_REBUILD_BELOW)"})
        return True

    def finish(self, D, G, F):
        """PySCF's final check: diagonalise the undamped Fock matrix once more, rebuild,
        re-evaluate. Incremental (fp32 device): this last J/K is of the whole density with the
        fp64 factor on the host. The fp32 builds' rounding stays in the accumulated Fock matrix
        (water: E(HF) 2e-7 Eh off); the energy is stationary in D, so evaluated with fp64 J/K it
        carries that error squared, and this build is recorded as host work.
        Returns (mo_energy, C, e_tot, e_device: the fp32-Fock energy or None)."""
        D_last = D
        mo_e, C = self.diagonalize(F)
        D = self.density(C)
        e_device = None
        if self.incremental:
            e_device = self.energy(D, self.new_G(D, D_last, G, C))
            t1 = time.perf_counter()
            G = self.new_G(D, D_last, G, C, f=self.fac64 if self.fac64 is not None else self.fac)
            self.t0 -= self.timer.add("scf_final_fp64_host", t1, sync=False) - t1    # not charged to 'scf'
        else:
            G = self.new_G(D, D_last, G, C)
        return mo_e, C, self.energy(D, G), e_device

    def run(self, max_cycle: int) -> Reference:
        cycles, D, G, F = self.iterate(max_cycle)
        mo_e, C, e_tot, e_device = self.finish(D, G, F)
        C, mo_e = dfhf_dist.same_orbitals(C, mo_e, self.world)
        self.timer.add("scf", self.t0)
        return self.reference_of(C.detach().cpu().numpy(), mo_e.detach().cpu().numpy(), e_tot,
                                 self.record(cycles, e_device))

    def reference_of(self, C, mo_e, e_tot: float, record: ScfRecord) -> Reference:
        """The Reference of converged orbitals C (nao, nmo) and energies mo_e (nmo,) numpy."""
        return restricted(C, mo_e, self.nocc, e_hf=e_tot, source=ENGINE, scf=record,
                          jk_auxbasis=scf.describe_auxbasis(self.jk_spec))

    def record(self, cycles: int, e_device: float | None) -> ScfRecord:
        """What ran this SCF (kernels and times of this stage only)."""
        be, fac, timer = self.backend, self.fac, self.timer
        used = {k: v - self.kernels0.get(k, 0) for k, v in be.kernels_used.items() if v != self.kernels0.get(k, 0)}
        times = {k: v - self.seconds0.get(k, 0.0) for k, v in timer.seconds.items() if v != self.seconds0.get(k, 0.0)}
        host = ("PySCF: S, hcore, E_nuc" + ("" if self.dm0_given is not None else ", the 'minao' guess")
                + "; DIIS's small solve"
                + ("; (P|Q) and (μν|P) by libcint" if self.engine.name == "host" else ""))
        if self.dense is not be:
            host += "; fp64 dense algebra (orthogonalisation, Fock diagonalisation, density, DIIS, Fock sums)"
        if self.host_builds:
            host += "; G rebuilt from the whole density with the fp64 factor, " + ", ".join(
                f"at cycle {b['cycle']} (gradient {b['gnorm_before']:.2g}, {b['why']})" for b in self.host_builds)
        return ScfRecord(
            engine=ENGINE, reference=self.reference, device=be.name, source="ran", iterations=cycles,
            conv_tol_grad=self.conv_tol_grad, guess=self.guess_name,
            jk=self.jk_text,
            jk_auxbasis=scf.describe_auxbasis(self.jk_spec), backend_engine=be.engine,
            precision={"jk": "fp32, then fp64" if self.fp32_cycles else str(self.jk_dtype).replace("torch.float", "fp"),
                       "fock_energy": "fp64",
                       "fock_build": "incremental (J/K of ΔD, Fock summed in fp64)" if self.incremental
                       else "full (J/K of D each cycle)"},
            kernels=dict(sorted(used.items())), times=times,
            host_kernels=dict(sorted(self.dense.kernels_used.items())) if self.dense is not be else {},
            jk_factor={"naux": fac.naux, "shape": list(fac.B.shape), "mb": fac.B.numel() * fac.B.element_size() / 1e6,
                       "metric": fac.metric, "exchange_block": fac.block},
            integrals=self.engine.describe(), e_hf_device_fock=e_device, host=host,
            final_energy=("J/K of the converged density with the fp64 factor on the host "
                          "(the energy's error from the fp32 cycles enters squared)"
                          if self.fac64 is not None else "the last J/K of the whole density on the device"),
            cycle_precision=self.cycle_record(cycles))

    def cycle_record(self, cycles: int) -> dict:
        """Which cycles built J/K in which precision (provenance.cycle_precision)."""
        n32 = cycles - len(self.host_builds) if self.mode == "fp32" else self.fp32_cycles
        f32 = self.fac32
        return cycle_precision(self.mode, self.requested, why=self.why, fp32_cycles=n32, fp64_cycles=cycles - n32,
                               switch=self.switch, device=self.backend.name if n32 else None,
                               fp32_factor_mb=f32.B.numel() * f32.B.element_size() / 1e6 if f32 is not None else None)


class DFUHF(DFRHF):
    """Our DF-UHF: DFRHF with two spin channels, its spin-dependent steps overridden and the rest
    (the JK factor, iterations, mixed precision, incremental builds, finish, record) kept.
    D, G, F (2, nao, nao), C (2, nao, nmo) and mo_energy (2, nmo) are stacked alpha, beta:
        G_s = J(D_a + D_b) - K(D_s),  D_s = C_s,occ C_s,occ^T,  E = Σ_s tr D_s (H + G_s/2) + E_nuc
    one J of the total density, one K per spin (JKFactor.exchange). DIIS extrapolates both spins
    at once: one error vector of the stacked commutators F_s D_s S - S D_s F_s (PySCF's UHF
    DIIS), UHF_DIIS_SPACE of them. The orbital gradient is ||(C_a,vir^T F_a C_a,occ, C_b,vir^T F_b C_b,occ)|| (PySCF's
    UHF get_grad). Guess: PySCF's UHF ``get_init_guess`` ('minao', half the RHF density per spin;
    a singlet's symmetry broken as PySCF does). <S^2> of the result: ``reference.spin_square``."""

    reference = "UHF"
    diis_space = UHF_DIIS_SPACE
    planned_rebuild = UHF_PLANNED_REBUILD
    jk_text = "J of the total density by GEMVs, K per spin by GEMM + SYRK over the packed JK factor"

    def __init__(self, mol, backend, *, check_stability: bool = False, **kw):
        self.nocc_s = tuple(int(n) for n in mol.nelec)        # (alpha, beta)
        self.check_stability = check_stability
        super().__init__(mol, backend, **kw)

    def run(self, max_cycle: int) -> Reference:
        """DFRHF.run, then (``check_stability``) the internal stability check of the converged
        UHF with this SCF's J/K (``hessian_product``, dfmp2.scf.stability; time 'stability'): its
        record in ``ScfRecord.stability``."""
        ref = super().run(max_cycle)
        if self.check_stability:
            t0 = time.perf_counter()
            todev = self.dense.to_device
            C = todev(torch.from_numpy(np.stack([c.mo_coeff for c in ref.channels])), torch.float64)
            mo_e = todev(torch.from_numpy(np.stack([c.mo_energy for c in ref.channels])), torch.float64)
            rec = stability.lowest_root(*self.hessian_product(C, mo_e), ran=(
                f"ours: Hessian products with this SCF's J/K ({self.backend.name}, "
                f"{str(self.fac.B.dtype).replace('torch.float', 'fp')} factor), pyscf.lib.davidson on the host"))
            ref.scf.stability = rec.to_dict()
            self.timer.add("stability", t0)
        return ref

    def density_shape(self) -> tuple:
        return (2, self.nao, self.nao)

    def initial_density(self):
        """PySCF's UHF default guess, (2, nao, nao) numpy."""
        return pyscf_uhf.UHF(self.mol).get_init_guess()

    def guess(self):
        D = self.dense.to_device(np.asarray(self.dm0), torch.float64)
        return D, self.two_electron(D, *self.delta_factors(D, self.nao))

    def two_electron(self, Dm, C, split=(None, None), f=None):
        """G (2, nao, nao) fp64: G_s = J(Dm_a + Dm_b) - K(Dm_s); C and split one per spin."""
        f = f or self.cycle_factor()
        return self.coulomb(Dm[0] + Dm[1], f) - self.exchange(f, list(zip(C, split)), 1.0)

    def occupied_factor(self, C):
        return tuple(C[s][:, :n] for s, n in enumerate(self.nocc_s)), (None, None)

    def delta_factors(self, dD, width=None):
        """Per spin (``delta_factor``, the same width for both: one kernel shape)."""
        pairs = [self.delta_factor(d, width) for d in dD]
        return tuple(c for c, _ in pairs), tuple(s for _, s in pairs)

    def diagonalize(self, F):
        pairs = [DFRHF.diagonalize(self, Fs) for Fs in F]
        return torch.stack([e for e, _ in pairs]), torch.stack([c for _, c in pairs])

    def density(self, C):
        return torch.stack([linalg.syrk(Cs[:, :n], backend=self.dense) if n else torch.zeros_like(self.S)
                            for Cs, n in zip(C, self.nocc_s)])

    def diis_error(self, F, D):
        return torch.stack([DFRHF.diis_error(self, Fs, Ds) for Fs, Ds in zip(F, D)])

    def orbital_gradient(self, F, C) -> float:
        return math.hypot(*(self.gradient_norm(F[s], C[s], n) for s, n in enumerate(self.nocc_s)))

    @classmethod
    def response(cls, fac: JKFactor, dense, nocc_s) -> "DFUHF":
        """This class's J/K steps (``two_electron``, ``delta_factors``, ``hessian_product``) over a
        given fp64 factor ``fac`` on the fp64 backend ``dense``, without an SCF: the converged
        UHF's orbital response after the energy (the UHF gradient's Z-vector, dfmp2.grad.uhf).
        nocc_s: (alpha, beta) occupied orbitals. One process (no split factor), fp64 throughout."""
        if fac.B.dtype != torch.float64 or not dense.has_fp64:
            raise ValueError("the response's J/K are fp64: an fp64 factor on an fp64 backend")
        self = cls.__new__(cls)
        self.fac, self.fac32, self.fac64, self.dense, self.backend = fac, None, None, dense, dense
        self.world, self.nao = distributed.World(), fac.nao
        self.nocc_s = tuple(int(n) for n in nocc_s)
        self.nocc = max(self.nocc_s)
        self.fp32_phase, self.g_noise = False, 0.0
        return self

    def hessian_product(self, C: torch.Tensor, mo_e: torch.Tensor):
        """(hop, hdiag) of the orbital Hessian of the converged UHF with orbitals C (2, nao, nmo)
        and energies mo_e (2, nmo) on the dense device, in PySCF's gen_g_hop_uhf convention
        (dfmp2.scf.stability): hop(x) (numpy (n,) -> (n,), n = Σ_s nvir_s nocc_s, Hartree) builds
        G_s = J(dD_a + dD_b) - K(dD_s) of dD_s = C_v x_s C_o^T + C_o x_s^T C_v^T with this SCF's
        J/K on the device (fp64 factor where the device has it; K of dD_s from the factors
        (C_v x_s ± C_o)/√2, split as in the incremental builds); hdiag (n,) = e_a - e_i."""
        dense, f = self.dense, self.fac
        occ = [(C[s][:, :n], C[s][:, n:], mo_e[s][:n], mo_e[s][n:]) for s, n in enumerate(self.nocc_s)]
        sizes = [(cv.shape[1], co.shape[1]) for co, cv, _, _ in occ]
        hdiag = np.concatenate([(ev[:, None] - eo[None, :]).reshape(-1).cpu().numpy() for _, _, eo, ev in occ])

        def hop(x):
            xs, p = [], 0
            for nv, no in sizes:
                xs.append(dense.to_device(torch.from_numpy(np.ascontiguousarray(x[p:p + nv * no])), torch.float64
                                          ).reshape(nv, no))
                p += nv * no
            dD, factors = [], []
            for (co, cv, _, _), xk in zip(occ, xs):
                a = cv @ xk
                dD.append(a @ co.mT + co @ a.mT)
                factors.append(torch.cat([a + co, a - co], dim=1) / math.sqrt(2.0))
            G = self.two_electron(torch.stack(dD), tuple(factors), split=tuple(self.nocc_s), f=f)
            out = [(cv.mT @ G[s] @ co + ev[:, None] * xk - xk * eo[None, :]).reshape(-1)
                   for s, ((co, cv, eo, ev), xk) in enumerate(zip(occ, xs))]
            return torch.cat(out).cpu().numpy()
        return hop, hdiag

    def reference_of(self, C, mo_e, e_tot: float, record: ScfRecord) -> Reference:
        """Two channels, with <S^2> of the occupied orbitals."""
        na, nb = self.nocc_s
        s2 = spin_square(C[0][:, :na], C[1][:, :nb], self.S.cpu().numpy())
        return unrestricted(C, mo_e, self.nocc_s, e_hf=e_tot, source=ENGINE, scf=record,
                            jk_auxbasis=scf.describe_auxbasis(self.jk_spec), s2=s2)
