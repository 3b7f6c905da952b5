"""The JK factor of our DF-SCF and the J and K builds over it (where the K build is).

Host (PySCF, fp64, O(N^2) or one-off): the overlap S, hcore (``pyscf.scf.hf.get_hcore``, so
ECPs and ghost atoms come with it), E_nuc, the initial guess (PySCF's default 'minao', so the
iteration counts compare), and the raw integrals (P|Q) and packed (μν|P) (dfmp2.df.integrals) over
the JK-fit set ``dfmp2.df.basis.default_auxbasis(mol, 'jk')``, exactly PySCF's DF-RHF's.

Device (linalg, the heavy part):
    JK factor  B = L^-1 (P|μν), L L^T = (P|Q) (one right-side TRSM of the whole raw factor), kept
               resident unpacked (naux, nao, nao) where the memory plan has room, else packed μ >= ν
               (naux, nao(nao+1)/2)
    unpacked   per block of P (JK_BLOCK_MB): Z = C^T B_P (one GEMM), K's lower triangle += Z^T Z
               (one GEMM per block row, in place), γ_P from the same Z, J += Σ_P γ_P B_P (``JKFactor.jk``)
    packed     J:  γ = B d,  J = unpack(B^T γ)   d = packed D, off-diagonal elements doubled (two GEMMs)
               K:  per block of P, the block unpacked, then Z and K as above; D = C C^T (columns
               scaled by the occupation)
    disk       the packed fp64 factor in a scratch file when no layout fits in memory: fitted in row
               blocks (``fit_to_disk``), streamed each pass and unpacked block by block, J and K as
               over the unpacked factor (``DiskJKFactor``). ``JKFactor.blocks`` is the one loop over
               the factor's unpacked blocks for every layout.
Dense O(N^3) algebra (canonical orthogonalisation, Fock diagonalisation, density, commutator,
DIIS) in fp64: on the device where it has fp64, on the host where it has not (Trainium; recorded
in ``ran['scf']['host_kernels']``).

Shapes: the factor is (naux, nao(nao+1)/2) packed or (naux, nao, nao) unpacked (``JKFactor``; the
layout 'unpacked', ``unpacked``, and a mixed SCF's fp32 copy, ``fp32_unpacked``), densities and J, K
(nao, nao), Hartree. Exchange blocks of ``jk_block`` auxiliary functions, near JK_BLOCK_MB MB
unpacked (DISK_UNPACK_MB for a factor on disk). ``build_jk_factor``
fits the factor in fixed groups of auxiliary rows, one process or split over the ranks
(dfmp2.scf.jk_dist: J and K are summed group by group in group order, the same bits at any rank
count). DFRHF (dfmp2.scf.rhf), DFUHF
(dfmp2.scf.uhf) and the gradient's response (dfmp2.grad) build their J and K here.
"""

from __future__ import annotations

import copy
import mmap
import os
import time
import warnings

import numpy as np
import torch
from pyscf.scf import _vhf

from dfmp2 import distributed, linalg
from dfmp2.df import integrals
from dfmp2.df.background import Background
from dfmp2.df.fitting import apply_metric, describe_metric, fit_metric
from dfmp2.df.outofcore import SCRATCH
from dfmp2.errors import InputError
from dfmp2.io.outputs import writing
from dfmp2.linalg import torch_ops
from dfmp2.options import SCF_SCREEN
from dfmp2.scf import jk_dist

JK_BLOCK_MB = 64.0  # target MB of one unpacked factor block in the exchange build
# on a GPU (caps.cuda_memory): fewer, larger blocks. At 16 MB, (H2O)32's 3-row blocks made 130,000
# GEMM launches in 18 cycles on an H200 (scripts/results/gpu_engines_h200/h2o32_host.json), the SCF at
# about 2 TFLOP/s. 2 GB holds one whole fixed group of the factor (jk_dist: at most GROUP_ROWS_MAX
# rows; (H2O)32: 16 groups of 232 rows at nbasis 768, 1.1 GB fp64): 16 blocks a build, each GEMM of
# 178,000 x 768 x 2 nocc. Not measured yet: scripts/gpu_acceptance.py --preset issue59 profiles it
JK_BLOCK_MB_GPU = 2048.0
DISK_BLOCK_MB = 64.0  # MB of one packed fp64 row block read from the factor on disk (the reader's unit)
DISK_READ_DEPTH = 1  # row blocks read ahead of the one being used
SCATTER_MB = 8.0  # a screened factor's unpack: MB of full packed rows its scatter fills at a time
DISK_UNPACK_MB = 16.0  # a factor on disk: each read row block unpacked this many MB at a time, into
# one buffer its GEMMs then read from the cache (DiskJKFactor.blocks). The resident unpacked factor's
# blocks are views: JK_BLOCK_MB there, where 16 MB blocks ran slower (scripts/results/scf_kernels.md)
LAYOUTS = ("packed", "unpacked", "disk")
SCREEN_DEFAULT = SCF_SCREEN  # Schwarz threshold of the JK factor's pairs (``significant_pairs``), Psi4's
# integral tolerance; what it changes: scripts/results/bench_screening.md (within 1e-11 Eh of every pair)


def npair(nao: int) -> int:
    return nao * (nao + 1) // 2


def significant_pairs(mol, threshold: float) -> np.ndarray | None:
    """The packed positions (int64, ascending; μ >= ν in PySCF's order) of the AO pairs kept in the
    JK factor: those of shell pairs (I, J) whose Schwarz bound max sqrt((μν|μν)) over the pair's
    functions (PySCF's ``CVHFnr_int2e_q_cond``, as its direct SCF screens) is at least
    ``threshold`` (Hartree^1/2). None when ``threshold`` <= 0 or every pair is kept: the
    unscreened factor, with nothing of screening in its code path."""
    if threshold <= 0:
        return None
    q = _vhf._VHFOpt(mol, "int2e", qcondname="CVHFnr_int2e_q_cond").q_cond  # (nbas, nbas)
    shell = np.repeat(np.arange(mol.nbas), np.diff(mol.ao_loc_nr()))  # each function's shell
    rows, cols = np.tril_indices(mol.nao_nr())
    keep = np.asarray(q)[shell[rows], shell[cols]] >= threshold
    return None if keep.all() else np.flatnonzero(keep)


def screening_record(nao: int, pairs, threshold: float, naux: int) -> dict:
    """``ran.scf.jk_factor.screening``: the threshold, the bound, and the pairs and MB (packed
    fp64) kept against the unscreened factor's."""
    kept = npair(nao) if pairs is None else len(pairs)
    return {
        "threshold": threshold,
        "bound": "Schwarz, sqrt((μν|μν)) of the shell pair (Hartree^1/2)",
        "pairs_kept": kept,
        "pairs_total": npair(nao),
        "kept_mb": round(naux * kept * 8 / 1e6, 3),
        "unscreened_mb": round(naux * npair(nao) * 8 / 1e6, 3),
    }


def exchange_block_mb(caps) -> float:
    """The exchange block's target MB on a device of capabilities ``caps``: JK_BLOCK_MB_GPU where
    its memory is a GPU's (launches, not caches, bound small blocks there), else JK_BLOCK_MB (the
    memory plan takes the next smaller when the larger does not fit)."""
    return JK_BLOCK_MB_GPU if caps.cuda_memory else JK_BLOCK_MB


def jk_block(nao: int, naux: int, itemsize: int, block_mb: float = JK_BLOCK_MB) -> int:
    """Auxiliary functions per exchange block: the unpacked block (nb, nao, nao) near block_mb."""
    return max(1, min(naux, int(block_mb * 1e6 // max(1, nao * nao * itemsize))))


class JKFactor:
    """The fitted JK factor B on the backend's device in ``dtype``: packed (naux, nao(nao+1)/2),
    μ >= ν in PySCF's order, or unpacked (naux, nao, nao) (``packed`` False: the memory plan's
    layout 'unpacked', and the mixed SCF's fp32 copy); J and K of a density from it (see the
    module docstring). The unpacked layout costs twice the memory and saves the per-cycle unpack:
    its exchange blocks are views, and ``jk`` builds J and K in one pass over it."""

    def __init__(self, B: torch.Tensor, nao: int, backend, block: int, metric: str, pairs=None, groups=None, row0=0):
        self.B, self.nao, self.backend, self.block, self.metric = B, nao, backend, block, metric
        self._set_pairs(pairs, B.device)
        self.groups = list(groups) if groups is not None else [(0, B.shape[0])]  # local rows, group order
        self.row0 = row0  # the global index of B's first row (its groups': dfmp2.scf.jk_dist)
        if self.packed:
            r, c = torch.tril_indices(nao, nao, device=B.device)
            if self.pairs is not None:
                r, c = r[self.pairs], c[self.pairs]
            self.lower = r * nao + c  # flat index of (μ, ν), μ >= ν
            self.offdiag_weight = torch.where(r == c, 1.0, 2.0).to(dtype=B.dtype)

    def _set_pairs(self, pairs, device) -> None:
        """``pairs``: the kept packed positions (``significant_pairs``; None: all), on ``device``;
        ``_fill``: the screened unpack's (rows, npair) buffer, zero at every dropped pair."""
        self.pairs = None if pairs is None else torch.as_tensor(pairs, dtype=torch.long).to(device)
        self._fill = None

    @property
    def npairs(self) -> int:
        """The packed columns stored: the kept pairs, or nao(nao+1)/2."""
        return npair(self.nao) if self.pairs is None else len(self.pairs)

    @property
    def naux(self) -> int:
        return self.B.shape[0]

    @property
    def dtype(self) -> torch.dtype:
        return self.B.dtype

    @property
    def device(self) -> torch.device:
        return self.B.device

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
        """(..., npairs) -> (..., nao, nao) symmetric (a layout step, no arithmetic):
        ``dfmp2.df.integrals.unpack``, into ``out`` when given. Screened: the kept columns are
        first copied into their places of a buffer that is zero at the dropped pairs, SCATTER_MB
        of rows at a time (one scatter, then the same unpack: about 1.4 times the unscreened
        unpack's time per row)."""
        if self.pairs is None:
            return integrals.unpack(p, self.nao, out=out)
        nao, rows = self.nao, p.reshape(-1, p.shape[-1])
        n = rows.shape[0]
        if out is None:
            out = torch.empty((n, nao * nao), dtype=p.dtype, device=p.device)
        square = out.view(n, nao * nao)
        step = max(1, int(SCATTER_MB * 1e6 // (npair(nao) * p.element_size())))
        if self._fill is None or self._fill.shape[0] < min(n, step) or self._fill.dtype != p.dtype:
            self._fill = torch.zeros((min(n, step), npair(nao)), dtype=p.dtype, device=p.device)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            full = self._fill[: r1 - r0].index_copy_(1, self.pairs, rows[r0:r1])
            integrals.unpack(full, nao, out=square[r0:r1])
        return square.view(p.shape[:-1] + (nao, nao))

    def coulomb(self, D: torch.Tensor, world=None) -> torch.Tensor:
        """J(D)_μν = Σ_λσ (μν|λσ) D_λσ (nao, nao) in the factor's dtype: per group of P two GEMMs
        (matrix-vector) over the packed factor (D packed, off-diagonal doubled) or the unpacked one
        (D flat), the groups' J added in group order (``world``: over its ranks, ``World.ordered_sum``)."""
        be, nao = self.backend, self.nao
        B = self.B if self.packed else self.B.view(self.naux, nao * nao)
        d = self.pack(D) if self.packed else D.reshape(-1).to(B.dtype)

        def parts():
            for g0, g1 in self.groups:
                gamma = linalg.gemm(B[g0:g1], d[:, None], backend=be)  # (rows, 1)
                yield linalg.gemm(B[g0:g1], gamma, trans_a=True, backend=be)[:, 0]  # (npair,) or (nao^2,)

        jp = _world(world).ordered_sum(parts(), (B.shape[1],), B.dtype, B.device, "scf")
        return self.unpack(jp) if self.packed else jp.view(nao, nao)

    def exchange(self, C: torch.Tensor, split: int | None = None, world=None) -> torch.Tensor:
        """K(D)_μν = Σ_λσ (μλ|νσ) D_λσ for D = C[:, :split] C[:, :split]^T - C[:, split:] C[:, split:]^T
        (split None: D = C C^T). C (nao, m); returns (nao, nao) fp64 (an fp32 factor's blocks are
        summed in fp64). Per block of P: Z = C^T B_P (one GEMM), K += Z^T Z (``_syrk_into``)."""
        return self.exchanges([(C, split)], world)[0]

    def exchanges(self, factors, world=None) -> torch.Tensor:
        """K of each (C, split) of ``factors`` (``exchange``), (nfactor, nao, nao) fp64: each group's
        K from zero, the groups' added in group order (over ``world``'s ranks: ``World.ordered_sum``)."""
        nao = self.nao
        cols = [(C.to(self.dtype), split) for C, split in factors]

        def add(K, p0, p1, Bf):
            for k, (Cd, split) in enumerate(cols):
                if Cd.shape[1]:
                    self._exchange_block(K[k], Cd, Bf.reshape((p1 - p0) * nao, nao), split)

        shape = (len(cols), nao, nao)
        K = _world(world).ordered_sum(self._group_sums(shape, add), shape, torch.float64, self.device, "scf")
        return torch.stack([_mirror(k) for k in K])

    def _group_sums(self, shape, add):
        """Each group's sum from zero, in group order (what ``World.ordered_sum`` adds): a zero fp64
        buffer of ``shape`` per group, ``add(buf, p0, p1, B_P)`` called on it for each of the group's
        blocks (``group_blocks``)."""
        buf, current = None, None
        for g, p0, p1, Bb in self.group_blocks():
            if g != current:
                if buf is not None:
                    yield buf
                buf, current = torch.zeros(shape, dtype=torch.float64, device=self.device), g
            add(buf, p0, p1, Bb)
        if buf is not None:
            yield buf

    def blocks(self):
        """(p0, p1, B_P (p1 - p0, nao, nao)) over the factor's auxiliary functions, group by group
        (``group_blocks``)."""
        for _, p0, p1, Bb in self.group_blocks():
            yield p0, p1, Bb

    def group_blocks(self):
        """(group, p0, p1, B_P (p1 - p0, nao, nao)) over the factor's groups in order, each in blocks
        of at most ``block`` functions (a group split evenly: the same blocks in every rank count),
        in its dtype on its device: views of an unpacked factor; a packed block is unpacked into
        one buffer reused from block to block (use it before asking for the next)."""
        buf = None
        if self.packed:
            buf = torch.empty((min(self.block, self.naux), self.nao * self.nao), dtype=self.dtype, device=self.device)
        for g, (g0, g1) in enumerate(self.groups):
            n = -(-(g1 - g0) // max(1, self.block))
            for i in range(n):
                p0, p1 = g0 + (g1 - g0) * i // n, g0 + (g1 - g0) * (i + 1) // n
                if self.packed:
                    yield g, p0, p1, self.unpack(self.B[p0:p1], out=buf[: p1 - p0])
                else:
                    yield g, p0, p1, self.B[p0:p1]

    def _exchange_block(self, K, Cd, Bf, split, sign=None):
        """K's lower triangle += Z^T Z (split: minus for the columns from ``split`` on) with
        Z = Cd^T B_P of one block Bf ((nb nao, nao), its P's unpacked). With ``sign`` (m,) returns
        γ_P = Σ_i sign_i (C^T B_P C)_ii (nb,) = Σ_λσ B_Pλσ D_λσ (a batched GEMV of Z)."""
        be, nao, m = self.backend, self.nao, Cd.shape[1]
        nb = Bf.shape[0] // nao
        if Bf.dtype == torch.float32 and be.caps.is_host:
            return self._exchange_block_batched(K, Cd, Bf.view(nb, nao, nao), split, sign)
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

    def _exchange_block_batched(self, K, Cd, B3, split, sign):
        """``_exchange_block`` of an fp32 block on the host CPU: Z_P = Cd^T B_P as one GEMM per P
        (a batched GEMM, B_P symmetric: the same Z), rows (P, i); K and γ_P as there. Why: MKL's
        SGEMM ran the one wide Cd^T Bf^T no faster than DGEMM, the batched products at SGEMM's
        rate; in fp64 both forms ran alike, so fp64 keeps the wide one and its bits (measured:
        scripts/results/scf_kernels.md)."""
        be, nao = self.backend, self.nao
        parts = [(Cd, 1.0)] if split is None else [(Cd[:, :split], 1.0), (Cd[:, split:], -1.0)]
        gamma = torch.zeros(B3.shape[0], dtype=torch.float64, device=B3.device) if sign is not None else None
        for Cp, alpha in parts:  # sign is +1 before split, -1 from it (``jk``)
            if Cp.shape[1]:
                Z = linalg.gemm(Cp, B3, trans_a=True, backend=be)  # (nb, m_p, nao)
                _syrk_into(K, Z.reshape(-1, nao), alpha, be)
                if gamma is not None:  # each i's trace (C^T B_P C)_ii, summed over i in fp64
                    gamma += alpha * (Z * Cp.mT).sum(-1).to(torch.float64).sum(1)
        return gamma

    def jk(self, factors, world=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(J, K) of the unpacked factor in one pass over it: J (nao, nao) of D = Σ_f D_f and K
        (nfactor, nao, nao) of each D_f, fp64, for ``factors`` [(C_f (nao, m_f), split_f)] with
        D_f = C_f[:, :split] C_f[:, :split]^T - C_f[:, split:] C_f[:, split:]^T (as ``exchange``).
        Per block of P, with its K GEMMs: γ_P = Σ_f Σ_i ±(C_f^T B_P C_f)_ii from the same Z (no
        pass over the factor for γ) and J += Σ_P γ_P B_P while the block is in cache (one GEMV).
        Each group's J and K from zero, the groups' added in group order (over ``world``'s ranks:
        ``World.ordered_sum``)."""
        nao, dt, dev = self.nao, self.dtype, self.device
        cols = []
        for C, split in factors:
            sign = torch.ones(C.shape[1], dtype=dt, device=dev)
            if split is not None:
                sign[split:] = -1.0
            cols.append((C.to(dt), split, sign))
        shape = (1 + len(cols), nao, nao)

        def add(JK, p0, p1, Bb):
            self._jk_block(JK[0].view(1, nao * nao), JK[1:], cols, Bb.reshape(p1 - p0, nao * nao))

        JK = _world(world).ordered_sum(self._group_sums(shape, add), shape, torch.float64, dev, "scf")
        return JK[0], torch.stack([_mirror(k) for k in JK[1:]])

    def _jk_block(self, J, K, cols, Bb) -> None:
        """J (1, nao^2) and K (nfactor, nao, nao) fp64 += one block's (``jk``), Bb (nb, nao^2)."""
        nao, nb = self.nao, Bb.shape[0]
        gamma = torch.zeros(nb, dtype=torch.float64, device=Bb.device)
        for k, (Cd, split, sign) in enumerate(cols):
            if Cd.shape[1]:
                gamma += self._exchange_block(K[k], Cd, Bb.reshape(-1, nao), split, sign)
        if Bb.dtype == torch.float64:
            linalg.gemm(gamma[None, :], Bb, beta=1.0, out=J, backend=self.backend)
        else:  # an fp32 factor: each block's short sum over P in fp32, the blocks summed in fp64
            J += linalg.gemm(gamma.to(Bb.dtype)[None, :], Bb, backend=self.backend).to(J.dtype)


def _world(world):
    """``world``, or a one-process World (its ordered sum: the running sum alone)."""
    return world if world is not None else distributed.World()


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


def disk_rows(nao: int, naux: int, block_mb: float = DISK_BLOCK_MB, pairs: int | None = None) -> int:
    """Auxiliary functions per packed fp64 row block of the factor on disk: near ``block_mb``, and
    at most an eighth of the factor (a small factor's blocks stay small beside it). ``pairs``: the
    packed columns stored (screening; default all nao(nao+1)/2)."""
    width = npair(nao) if pairs is None else pairs
    return max(1, min(-(-naux // 8), int(block_mb * 1e6 // max(1, width * 8))))


class DiskJKFactor(JKFactor):
    """The fitted fp64 factor packed (naux, nao(nao+1)/2), μ >= ν, in a scratch HDF5 file (layout
    'disk', ``fit_to_disk``): for a run whose memory cannot hold it. Every pass (``blocks``: J and K
    in one pass, ``jk``; the gradient's loops) streams the file in row blocks of ``read_rows``
    (DISK_BLOCK_MB) read by a background thread DISK_READ_DEPTH blocks ahead of the one in use, each
    unpacked and handed out in sub-blocks of ``block`` (cache-sized, as over the unpacked factor),
    one sub-block at a time into one buffer. h5py releases the GIL inside its read, so the read of
    block k+1 overlaps the GEMMs of block k. ``stats``: passes, bytes read, seconds reading (the thread) and seconds the
    caller waited for a block (what the disk cost the run). ``fp32``: a view of the same file
    whose blocks are unpacked in fp32 (a mixed SCF's fp32 cycles: no copy of the factor)."""

    block_dtype = torch.float64  # the dtype blocks are unpacked into (``fp32``: float32)

    def __init__(self, ds, path, nao: int, naux: int, backend, block: int, read_rows: int, metric: str, pairs=None):  # noqa: PLR0913
        self.ds, self.path, self._naux, self.read_rows = ds, path, naux, read_rows
        self.B, self.nao, self.backend, self.block, self.metric = None, nao, backend, block, metric
        self._set_pairs(pairs, backend.device)
        self.stats = {"passes": 0, "read_bytes": 0, "read_s": 0.0, "wait_s": 0.0}
        self.offset = None  # the raw data's byte offset in the file, once written (``map_file``)
        self.groups, self.row0 = [(0, naux)], 0  # one process: one group (its blocks: the file's)

    def map_file(self) -> None:
        """Map the file in later passes (``mapped``): HDF5 stores the dataset contiguous and
        unfiltered, so its rows are plain fp64 at one offset (h5py's ``get_offset``; None where
        HDF5 did not allocate it in one piece: read through h5py then)."""
        self.ds.file.flush()
        self.offset = self.ds.id.get_offset()

    @property
    def naux(self) -> int:
        return self._naux

    @property
    def dtype(self) -> torch.dtype:
        return self.block_dtype

    def fp32(self) -> DiskJKFactor:
        """This factor's file read as fp32 blocks: each packed fp64 row block rounded to fp32, then
        unpacked in fp32 (the mixed SCF's fp32 cycles; what an fp32 copy in memory would hold,
        without the copy). Shares the file, its map and ``stats`` (its passes are counted there)."""
        view = copy.copy(self)
        view.block_dtype, view._fill = torch.float32, None
        view.block = jk_block(self.nao, self.naux, 4, DISK_UNPACK_MB)
        return view

    @property
    def device(self) -> torch.device:
        return self.backend.device

    @property
    def packed(self) -> bool:  # packed on disk; in memory only a block at a time
        return False

    @property
    def layout(self) -> str:
        return "disk"

    @property
    def disk_mb(self) -> float:
        return self.naux * self.npairs * 8 / 1e6

    def _read(self, rows: tuple[int, int]) -> tuple[int, int, torch.Tensor]:
        """Rows p0:p1 of the packed factor, on the backend's device (the reader thread's call)."""
        p0, p1 = rows
        t0 = time.perf_counter()
        host = torch.empty((p1 - p0, self.npairs), dtype=torch.float64)
        self.ds.read_direct(host.numpy(), np.s_[p0:p1])
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["read_bytes"] += host.numel() * 8
        return p0, p1, self.backend.to_device(host, torch.float64)

    def _mapped(self, rows: tuple[int, int]):
        """Rows p0:p1 mapped from the file, not copied (the reader thread's call, a CPU backend):
        an mmap of their bytes populated by the kernel at once (MAP_POPULATE: read from the disk,
        or found in the page cache, and mapped in this thread) and its read-only (p1 - p0, npair)
        numpy view. The caller unpacks from the view and drops both (unmapped when freed). Reading
        into a buffer instead (``_read``) copies every byte out of the page cache once more: on 2
        cores that copy took a core from the GEMMs ((H2O)24: 52.7 s of an SCF's 165 s)."""
        p0, p1 = rows
        n = self.npairs
        t0 = time.perf_counter()
        start = self.offset + p0 * n * 8
        base = start - start % mmap.ALLOCATIONGRANULARITY
        fd = os.open(self.path, os.O_RDONLY)
        try:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = mmap.mmap(fd, (p1 - p0) * n * 8 + start - base, flags=flags, prot=mmap.PROT_READ, offset=base)
        finally:
            os.close(fd)
        view = np.frombuffer(mm, dtype=np.float64, count=(p1 - p0) * n, offset=start - base).reshape(p1 - p0, n)
        self.stats["read_s"] += time.perf_counter() - t0
        self.stats["read_bytes"] += view.nbytes
        return p0, p1, (mm, view)

    def packed_rows(self, p0: int, p1: int, mapped: bool = False):
        """(q0, q1, packed rows q0:q1 (q1 - q0, npair)) of rows p0:p1 in blocks of ``read_rows``,
        read ahead by a background thread (Background; its close also ends the reads when the
        caller stops early or fails); ``mapped``: (mmap, its numpy view) of the rows instead
        (``_mapped``; the file's raw data must be contiguous: ``offset``)."""
        ranges = [(q0, min(p1, q0 + self.read_rows)) for q0 in range(p0, p1, self.read_rows)]
        reader = Background("dfmp2-jk-read", DISK_READ_DEPTH).map(self._mapped if mapped else self._read, ranges)
        try:
            while True:
                t0 = time.perf_counter()
                item = next(reader, None)
                self.stats["wait_s"] += time.perf_counter() - t0
                if item is None:
                    return
                yield item
        finally:
            reader.close()

    @property
    def mapped(self) -> bool:
        """Whether passes map the file (``_mapped``): the backend computes on the host CPU itself
        (its capabilities' ``is_host``) and the raw data's offset is known."""
        return self.offset is not None and self.backend.caps.is_host

    def blocks(self):
        """(p0, p1, B_P (p1 - p0, nao, nao)) over the file in blocks of ``block`` functions, in
        ``dtype``: each row block of ``read_rows`` (read ahead, mapped or read) unpacked one block
        at a time, just before it is used, into one buffer of ``block`` rows (cache-sized: the
        GEMMs read it from the cache; use it before asking for the next). Unpacking the whole row
        block at once wrote it to memory and read it back. An fp32 view (``fp32``) rounds each
        block's packed rows first and unpacks them in fp32."""
        self.stats["passes"] += 1
        nb = min(self.block, self.read_rows, self.naux)
        buf = torch.empty((nb, self.nao * self.nao), dtype=self.dtype, device=self.device)
        for p0, p1, rows in self.packed_rows(0, self.naux, mapped=self.mapped):
            with warnings.catch_warnings():  # torch warns of the mapped rows' read-only view (only read)
                warnings.simplefilter("ignore", UserWarning)
                packed = torch.from_numpy(rows[1]) if self.mapped else rows
            for q0 in range(p0, p1, self.block):
                q1 = min(p1, q0 + self.block)
                part = packed[q0 - p0 : q1 - p0]
                yield q0, q1, self.unpack(part.to(self.dtype), out=buf[: q1 - q0])  # .to: no copy in fp64
            del rows, packed  # a map is unmapped when the reader lets go of it too (at the next row block)

    def group_blocks(self):
        """``blocks`` as one group (one process only: not bitwise with the in-memory layouts)."""
        for p0, p1, Bb in self.blocks():
            yield 0, p0, p1, Bb

    def describe(self) -> dict:
        """The factor's file and what streaming it cost (``ran.scf.jk_factor``)."""
        st = self.stats
        return {
            "disk_mb": round(self.disk_mb, 3),
            "read_block_mb": round(self.read_rows * self.npairs * 8 / 1e6, 3),
            "access": "mmap (no copy)" if self.mapped else "h5py read",
            "passes": st["passes"],
            "read_gb": round(st["read_bytes"] / 1e9, 3),
            "read_s": round(st["read_s"], 3),
            "read_wait_s": round(st["wait_s"], 3),
            "read_gb_per_s": round(st["read_bytes"] / 1e9 / st["read_s"], 3) if st["read_s"] > 0 else None,
        }


def fit_to_disk(mol, auxmol, fb, engine, scratch, timer, fit_mb: float, pairs=None) -> DiskJKFactor:
    """The fitted factor B = L^-1 (P|μν) in the scratch directory ``scratch``
    (dfmp2.df.outofcore.Scratch), without the whole factor ever in memory: a left-looking blocked
    forward substitution over row blocks I of about ``fit_mb`` MB (packed fp64), aligned to the
    integral engine's aux-shell blocks (``disk_rows`` functions each),
        B_I = L_II^-1 ((P|μν)_I - Σ_{J<I} L_IJ B_J),
    each (P|μν)_I made by the engine when it is needed, each B_J read back from the file (the
    background reader) and B_I written in its place. The flops are the in-memory TRSM's (the
    update as GEMMs); the file is read Σ_I (rows before I) times: about nI / 2 times the factor for
    nI row blocks. ``pairs``: the kept packed columns (``significant_pairs``; None: all), the
    only ones written. The metric must be positive definite (a Cholesky factor L): the eigh fallback
    (dfmp2.df.fitting) needs every raw row at once, refused here with one line before any 3-center
    integral."""
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    n = npair(nao) if pairs is None else len(pairs)
    t0 = time.perf_counter()
    j2c = engine.metric(auxmol).to(fb.device)
    t0 = timer.add("scf_integrals", t0)
    M, kind, info = fit_metric(j2c, fb)
    del j2c
    if kind != "cholesky":
        raise InputError(
            "the JK-fit metric is not positive definite, and the DF-SCF's factor on disk needs its "
            "Cholesky factor; allow more memory (the factor in memory), or use PySCF's DF-SCF "
            "(SCF mode 'pyscf-df')",
            option="memory_mb",
        )
    f = scratch.open("jk_factor")
    path = f.filename
    with writing(path, *SCRATCH):
        ds = f.create_dataset("B", shape=(naux, n), dtype="f8", fill_time="never")
    sub = jk_block(nao, naux, 8, DISK_UNPACK_MB)
    read_rows = disk_rows(nao, naux, pairs=n)
    fac = DiskJKFactor(ds, path, nao, naux, fb, sub, read_rows, describe_metric(kind, info), pairs)
    shells = integrals.aux_shell_blocks(auxmol, disk_rows(nao, naux))  # the engine's blocks, unscreened
    groups, rows_max = [], max(1, int(fit_mb * 1e6 // (n * 8)))
    for blk in shells:  # consecutive shell blocks, about rows_max rows a group (a shell block at least)
        if groups and blk[3] - groups[-1][0][2] <= rows_max:
            groups[-1].append(blk)
        else:
            groups.append([blk])
    raw = torch.empty((max(g[-1][3] - g[0][2] for g in groups), n), dtype=torch.float64, device=fb.device)
    t0 = timer.add("scf_fit", t0)
    with engine.blocks(auxmol, shells, torch.float64) as stream:
        it = iter(stream)
        for group in groups:
            g0, g1 = group[0][2], group[-1][3]
            X = raw[: g1 - g0]
            for _ in group:
                p0, p1, packed = next(it)
                X[p0 - g0 : p1 - g0] = _kept(packed.to(X.device), fac.pairs)
            del packed
            t0 = timer.add("scf_integrals", t0)
            for q0, q1, Bq in fac.packed_rows(0, g0, mapped=fac.mapped):
                if fac.mapped:  # the mapped rows, read only by the GEMM (torch warns of the read-only view)
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore", UserWarning)
                        Bq = torch.from_numpy(Bq[1])
                linalg.gemm(M[g0:g1, q0:q1], Bq, alpha=-1.0, beta=1.0, out=X, backend=fb)
                del Bq
            Bi = apply_metric(M[g0:g1, g0:g1].contiguous(), kind, X, fb)
            with writing(path, *SCRATCH):
                ds.write_direct(np.ascontiguousarray(Bi.cpu().numpy()), dest_sel=np.s_[g0:g1])
            del Bi
            if fac.offset is None:  # allocated by the first write: later groups read it mapped
                fac.map_file()
            t0 = timer.add("scf_fit", t0)
    fac.map_file()
    fac.stats.update(passes=0, read_bytes=0, read_s=0.0, wait_s=0.0)  # the cycles' reads from here
    fac.fit_blocks = len(groups)
    return fac


def _kept(packed: torch.Tensor, pairs) -> torch.Tensor:
    """The kept columns of packed rows (nb, nao(nao+1)/2) -> (nb, len(pairs)); all when None."""
    return packed if pairs is None else packed[:, pairs]


def fp32_unpacked(fac: JKFactor, block_mb: float = JK_BLOCK_MB, out: torch.Tensor | None = None) -> JKFactor:
    """The mixed SCF's fp32 copy of the fp64 factor, unpacked (naux, nao, nao): its exchange
    blocks are views, no unpack per cycle. Packed, the fp32 K was barely faster than fp64's on a
    CPU: the fp32 gather cost more than PySCF's C unpack in fp64 and ate most of what SGEMM + SSYRK
    saved (scripts/results/docstring-measurements.md); unpacked fp32 is the packed fp64 factor's size (nao^2 x 4 B
    against nao(nao+1)/2 x 8 B per function), counted in the memory plan. Only K uses it. ``out``:
    its fp32 storage, (naux, nao, nao) or (naux, nao^2) (``deferred_unpacked``), else a new tensor."""
    nao, naux = fac.nao, fac.naux
    B = out if out is not None else jk_dist.aligned_rows(naux, nao * nao, fac.row0, torch.float32, fac.B.device)
    B = B.view(naux, nao, nao)
    step = jk_block(nao, naux, 8, block_mb)
    buf = torch.empty((min(step, naux), nao * nao), dtype=fac.B.dtype, device=fac.B.device) if fac.packed else None
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        B[p0:p1] = fac.unpack(fac.B[p0:p1], out=buf[: p1 - p0]) if fac.packed else fac.B[p0:p1]
    return JKFactor(B, nao, fac.backend, jk_block(nao, naux, 4, block_mb), fac.metric, None, fac.groups, fac.row0)


def unpacked(fac: JKFactor, block_mb: float = JK_BLOCK_MB, out: torch.Tensor | None = None) -> JKFactor:
    """The packed factor unpacked (naux, nao, nao) in its dtype and on its device, row block by row
    block (the packed one is dropped by the caller: both are resident until then), with exchange
    blocks of ``block_mb``. ``out``: its storage, (naux, nao, nao) or (naux, nao^2), else a new tensor."""
    nao, naux = fac.nao, fac.naux
    U = out if out is not None else jk_dist.aligned_rows(naux, nao * nao, fac.row0, fac.B.dtype, fac.B.device)
    U = U.view(naux, nao, nao)
    step = jk_block(nao, naux, fac.B.element_size(), block_mb)
    for p0 in range(0, naux, step):
        p1 = min(naux, p0 + step)
        fac.unpack(fac.B[p0:p1], out=U[p0:p1])
    block = jk_block(nao, naux, fac.B.element_size(), block_mb)
    return JKFactor(U, nao, fac.backend, block, fac.metric, None, fac.groups, fac.row0)


def deferred_unpacked(fac: JKFactor) -> tuple[torch.Tensor, torch.Tensor]:
    """Storage for a mixed SCF with the unpacked layout: (U64, U32), both (naux, nao^2), views
    of one buffer the size of the unpacked fp64 factor (``jk_dist.aligned_pair``). Its fp32 copy
    (``fp32_unpacked`` into U32) takes the first half while the fp64 factor stays packed; when
    the fp32 cycles end, the fp64 factor is unpacked into U64 over it (``DFRHF.maybe_switch``).
    Against an fp32 copy beside the unpacked fp64 factor, the cycles hold the packed factor
    instead of the copy, and the run touches the copy's size (naux nao^2 4 B) less fresh memory:
    on a virtual machine the first touch of fresh memory cost more than making the copy."""
    return jk_dist.aligned_pair(fac.naux, fac.nao * fac.nao, fac.row0, fac.device)


def build_jk_factor(  # noqa: PLR0913
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
    scratch=None,
    fit_mb: float | None = None,
    pairs=None,
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
    The fit runs over the factor's fixed groups (dfmp2.scf.jk_dist.factor_rows: a blocked forward
    substitution); ``world`` over several ranks with the split SCF (dfmp2.distributed.split_scf):
    this rank's groups of the factor, the same bits as one process's rows. ``layout`` 'unpacked' (the memory plan's
    choice where the unpacked factor fits; ``driver.check_memory``): the factor on ``backend``
    unpacked (naux, nao, nao), exchange blocks of ``block_mb`` (``JKFactor.jk``). 'disk' (the
    plan's choice where neither fits in memory): fitted in row blocks of ``fit_mb`` MB into a file
    in ``scratch`` (dfmp2.df.outofcore.Scratch, removed by its owner) and streamed every pass
    (``fit_to_disk``, ``DiskJKFactor``; fp64 on an fp64 backend, one process). ``pairs``: the kept
    packed columns (``significant_pairs``; None: every pair), the only ones fitted and stored in
    the packed and disk layouts (the unpacked one holds zeros at the others)."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown JK factor layout {layout!r}; use one of {', '.join(LAYOUTS)}")
    fb = fit_backend if fit_backend is not None else backend
    engine = engine or integrals.HostEngine(mol, fb)
    if layout == "disk":
        if dtype != torch.float64 or not backend.has_fp64 or (world is not None and distributed.split_scf(world)):
            raise ValueError("the JK factor on disk is fp64 on an fp64 device, in one process")
        if scratch is None or fit_mb is None:
            raise ValueError("the JK factor on disk needs a scratch directory and the fit's block size")
        return fit_to_disk(mol, auxmol, backend, engine, scratch, timer, fit_mb, pairs), None
    nao = mol.nao_nr()
    itemsize = torch.finfo(dtype).bits // 8
    world = world if world is not None and distributed.split_scf(world) else distributed.World()
    B, kind, info, groups, row0 = jk_dist.factor_rows(mol, auxmol, fb, engine, block_mb, world, timer, pairs)
    metric = describe_metric(kind, info)
    out = _factor_from(B, nao, auxmol.nao_nr(), backend, fb, dtype, itemsize, block_mb, metric, pairs, groups, row0)
    return _laid_out(out, layout, timer, block_mb)


def _laid_out(out, layout: str, timer, block_mb: float):
    """(factor, fac64) of ``_factor_from`` with the factor in ``layout``, unpacked with exchange
    blocks of ``block_mb`` (the unpack timed as 'scf_fit'; the packed one freed when nothing else
    holds it)."""
    fac, fac64 = out
    if layout == "packed":
        return fac, fac64
    t0 = time.perf_counter()
    fac = unpacked(fac, block_mb)
    timer.add("scf_fit", t0)
    return fac, fac64


def _factor_from(  # noqa: PLR0913
    B, nao: int, naux: int, backend, fb, dtype, itemsize: int, block_mb: float, metric, pairs, groups, row0
):
    """(the JKFactor of the fp64 factor B on ``backend`` in ``dtype``, its fp64 one on ``fb`` or
    None). ``naux``: the whole factor's (the exchange block is the same in every rank count);
    ``groups``, ``row0``: B's groups and first row (dfmp2.scf.jk_dist.factor_rows)."""
    fac64 = None
    if dtype != torch.float64:
        fac64 = JKFactor(B, nao, fb, jk_block(nao, naux, 8, block_mb), metric, pairs, groups, row0)
    if B.device != backend.device or B.dtype != dtype:
        B = backend.to_device(B, dtype).contiguous()
    return JKFactor(B, nao, backend, jk_block(nao, naux, itemsize, block_mb), metric, pairs, groups, row0), fac64
