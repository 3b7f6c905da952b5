"""The Trainium (trn1/trn2) backend: linalg ops dispatched to the NKI kernels in kernels/nki.

Ops take and return torch CPU tensors; at the kernel boundary they become contiguous fp32
NumPy arrays (Trainium has no fp64; matmuls accumulate in fp32 PSUM). Host-side work is
limited to what is cheap and recorded as such: layout (transposes, index reversal,
zero padding), alpha/beta scaling, the fp64 Cholesky of the fitting metric
("cholesky:host-fp64"), the fp64 inverses of TRSM's 128x128 diagonal blocks (once per
matrix, "trsm_diag_inverse:host-fp64") and the fp64 sums of the pair kernel's partial sums.

Engines (``engine``): "neuron-hardware" (nki.jit on a NeuronCore), "nki.simulate" (AWS's
CPU simulator) and "nki-numpy-emulator" (kernels/nki_emulator). Without ``simulate`` only
the hardware engine is acceptable and its absence is a DeviceUnavailableError; with
``simulate`` nki.simulate is used when AWS's nki package is installed, else the emulator.
Nothing falls back silently: the engine is fixed when the backend is built and reported.

Compiles: each distinct (kernel, argument shapes, constants) is one compiled kernel on
hardware (nki.jit caches by shapes and compile-time values). Within a run only the GEMM row
count varies call to call (it follows the aux-shell block size), so GEMM rows are padded
up to a bucket (``bucket``: powers of two up to 128, multiples of 128 up to 1024, then four
steps per octave); K, N and the TRSM, SYRK and pair-kernel sizes are fixed by the molecule
and run unpadded (the kernels take ragged edge tiles). The pair kernel compiles per
(occupied block sizes, naux, nvir, symmetric): at most four shapes for each occupied
block size (full or ragged blocks, diagonal or not). Water/cc-pVDZ compiles 4 kernels
(2 GEMM, 1 TRSM, 1 pair). ``describe()`` lists the shapes and counts them.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from . import torch_ops
from .base import Backend
from .errors import DeviceUnavailableError
from .newton_schulz import newton_schulz_inv_sqrt

NEURON_DEVICES = ("trn1", "trn2")
PMAX = 128
PAIR_MAX_OCC = 32  # pairs per launch <= 32 x 32 (SBUF accumulator: 8 KiB per partition)


def bucket(n: int) -> int:
    """Padded size for a kernel dimension: bounds the number of distinct compiled shapes.
    <= 128: next power of two (at least 8); <= 1024: next multiple of 128; beyond, four
    steps per octave (waste < 25%)."""
    if n <= 0:
        return n
    if n <= 128:
        return max(8, 1 << (n - 1).bit_length())
    if n <= 1024:
        return 128 * math.ceil(n / 128)
    step = 1 << ((n - 1).bit_length() - 3)  # octave [2^p, 2^(p+1)) in steps of 2^(p-2)
    return step * math.ceil(n / step)


def _f32(t) -> np.ndarray:
    """torch tensor / array -> NumPy fp32 (a copy only where needed)."""
    if isinstance(t, torch.Tensor):
        t = t.detach().cpu().numpy()
    return np.asarray(t, dtype=np.float32)


def _pad2(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    if a.shape == (rows, cols) and a.flags.c_contiguous:
        return a
    out = np.zeros((rows, cols), dtype=np.float32)
    out[: a.shape[0], : a.shape[1]] = a
    return out


class NeuronBackend(Backend):
    """trn1/trn2 through the NKI kernels on one engine (see module docstring)."""

    def __init__(self, name: str, runner):
        super().__init__(name=name, engine=runner.engine)
        self.device = torch.device("cpu")  # host tensors stand for device memory
        self.target = name
        self.runner = runner
        self.precision = "fp32"
        self._dinv_cache: dict = {}
        from dfmp2.kernels.nki.mp2_pair import sbuf_bytes_per_partition
        from dfmp2.kernels.nki_emulator.limits import limits_for

        self._pair_sbuf = sbuf_bytes_per_partition
        self.sbuf_partition_bytes = limits_for(name).sbuf_partition_bytes

    # ---- placement ----
    def to_device(self, x, dtype=None) -> torch.Tensor:
        """Host tensor standing for device memory (the kernels run per call on it)."""
        t = torch.as_tensor(x)
        return t.to(device="cpu", dtype=dtype if dtype is not None else t.dtype)

    def synchronize(self) -> None:
        """Kernel launches return their results, so there is nothing outstanding."""

    # ---- GEMM ----
    def _gemm2d(self, A: np.ndarray, B: np.ndarray, a_is_T: bool) -> np.ndarray:
        """(M, K) @ (K, N) through the kernel; A given as its transpose when a_is_T.

        The kernel's stationary tiles are 128 wide and its moving tiles 512, so the product is
        oriented to need fewer nc_matmul instructions: C directly, or C^T = B^T A^T (the long
        dimension streams as the moving operand; e.g. the (nb*nao, nao) x (nao, nocc)
        transform). Only M is padded to its bucket: it varies with the aux-shell block size
        within a run, while K and N are fixed per molecule."""
        from dfmp2.kernels.nki.gemm import gemm_kernel

        lhsT = A if a_is_T else A.T
        K, M = lhsT.shape
        N = B.shape[1]
        if 0 in (M, N, K):
            return np.zeros((M, N), dtype=np.float32)
        Mp = bucket(M)
        direct = -(-Mp // 128) * -(-N // 512)
        swapped = -(-N // 128) * -(-Mp // 512)
        if swapped < direct:
            out = self.runner(gemm_kernel, np.ascontiguousarray(B), _pad2(lhsT, K, Mp))
            out = out[:, :M].T
        else:
            out = self.runner(gemm_kernel, _pad2(lhsT, K, Mp), np.ascontiguousarray(B))
            out = out[:M]
        self.record("gemm", "nki.gemm")
        return out

    def gemm(self, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        """C = alpha op(a) op(b) + beta out, fp32. 2-D operands, or a batched ``a`` (..., m, k)
        with a 2-D ``b`` (flattened into one launch), or broadcast batches (one launch each)."""
        A, B = _f32(a), _f32(b)
        if A.ndim == 2 and B.ndim == 2:
            C = self._gemm2d(A, B.T if trans_b else B, a_is_T=trans_a)
        elif A.ndim > 2 and B.ndim == 2 and not trans_a:
            lead = A.shape[:-1]
            C = self._gemm2d(A.reshape(-1, A.shape[-1]), B.T if trans_b else B, a_is_T=False)
            C = C.reshape(*lead, C.shape[-1])
        else:
            Am = np.swapaxes(A, -1, -2) if trans_a else A
            Bm = np.swapaxes(B, -1, -2) if trans_b else B
            batch = np.broadcast_shapes(Am.shape[:-2], Bm.shape[:-2])
            Am = np.broadcast_to(Am, batch + Am.shape[-2:])
            Bm = np.broadcast_to(Bm, batch + Bm.shape[-2:])
            C = np.empty(batch + (Am.shape[-2], Bm.shape[-1]), dtype=np.float32)
            for idx in np.ndindex(*batch):
                C[idx] = self._gemm2d(Am[idx], Bm[idx], a_is_T=False)
        if alpha != 1.0:
            C = C * np.float32(alpha)
        res = torch.from_numpy(np.ascontiguousarray(C, dtype=np.float32))
        if out is not None:
            if beta != 0.0:
                res = res + beta * out.to(torch.float32)
            out.copy_(res)
            return out
        return res

    # ---- SYRK ----
    def syrk(self, a, *, trans=False, alpha=1.0, uplo="lower", full=True):
        """alpha a a^T (trans=False, a (n, k)) or alpha a^T a (trans=True, a (k, n)); only the
        lower tile blocks are computed on the device."""
        from dfmp2.kernels.nki.syrk import syrk_lower_kernel

        A = _f32(a)
        aT = A if trans else A.T  # (k, n)
        k, n = aT.shape
        if n == 0:
            return torch.zeros((0, 0), dtype=torch.float32)
        if k == 0:
            return torch.zeros((n, n), dtype=torch.float32)
        C = self.runner(syrk_lower_kernel, np.ascontiguousarray(aT))
        self.record("syrk", "nki.syrk")
        L = np.tril(C[:n, :n])  # upper blocks were never written
        if alpha != 1.0:
            L = L * np.float32(alpha)
        if full:
            R = L + np.tril(L, -1).T
        else:
            R = L if uplo == "lower" else np.ascontiguousarray(L.T)
        return torch.from_numpy(np.ascontiguousarray(R, dtype=np.float32))

    # ---- TRSM ----
    def _diag_inverses(self, L: np.ndarray) -> np.ndarray:
        """(nblk, 128, 128) transposed inverses of L's diagonal blocks, fp64 on the host,
        cached per matrix (the fitting metric's factor is solved against many times)."""
        key = (L.shape, hashlib.blake2b(L.tobytes(), digest_size=16).hexdigest())
        dinvT = self._dinv_cache.get(key)
        if dinvT is None:
            import scipy.linalg

            n = L.shape[0]
            nblk = -(-n // PMAX)
            dinvT = np.zeros((nblk, PMAX, PMAX), dtype=np.float32)
            for kb in range(nblk):
                k0 = kb * PMAX
                kt = min(PMAX, n - k0)
                blk = L[k0 : k0 + kt, k0 : k0 + kt].astype(np.float64)
                inv = scipy.linalg.solve_triangular(blk, np.eye(kt), lower=True)
                dinvT[kb, :kt, :kt] = inv.T
            self._dinv_cache = {key: dinvT}  # keep only the latest matrix
            self.record("trsm_diag_inverse", "host-fp64")
        return dinvT

    def trsm(self, a, b, *, side="left", uplo="lower", trans=False, unit_diagonal=False, overwrite_b=False):
        """Solve op(a) X = b (left) or X op(a) = b (right), a triangular (n, n), fp32.
        Mapped on the host onto L X' = B' with L lower (transposes and index reversal).
        ``overwrite_b``: X copied into b, b returned."""
        from dfmp2.kernels.nki.trsm import trsm_lower_kernel

        if side not in ("left", "right") or uplo not in ("lower", "upper"):
            raise ValueError(f"trsm: side={side!r}, uplo={uplo!r}")
        A, Bm = _f32(a), _f32(b)
        vec = Bm.ndim == 1
        if vec:
            Bm = Bm[:, None] if side == "left" else Bm[None, :]
        lower = uplo == "lower"
        T = A.T if trans else A  # op(a)
        tri_lower = lower != trans
        if side == "right":  # X T = B  <=>  T^T X^T = B^T
            T, Bm, tri_lower = T.T, Bm.T, not tri_lower
        T = np.tril(T) if tri_lower else np.triu(T)
        if not tri_lower:  # J T J is lower for the reversal J
            T, Bm = T[::-1, ::-1], Bm[::-1]
        if unit_diagonal:
            T = np.tril(T, -1) + np.eye(T.shape[0], dtype=np.float32)
        n, m = Bm.shape
        if n == 0 or m == 0:
            X = np.zeros((n, m), dtype=np.float32)
        else:
            Lc = np.ascontiguousarray(T)
            dinvT = self._diag_inverses(Lc)
            X = self.runner(trsm_lower_kernel, np.ascontiguousarray(Lc.T), dinvT, np.ascontiguousarray(Bm))
            self.record("trsm", "nki.trsm")
        if not tri_lower:
            X = X[::-1]
        if side == "right":
            X = X.T
        if vec:
            X = X[:, 0] if side == "left" else X[0]
        X = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32))
        return b.copy_(X) if overwrite_b else X

    # ---- host fp64 factorisations; Newton-Schulz on the NKI GEMM ----
    def cholesky(self, a):
        """Cholesky of the fitting metric on the host in fp64 (returned in a's dtype);
        same contract and errors as linalg.torch_ops.cholesky."""
        self.record("cholesky", "host-fp64")
        t = torch.as_tensor(a)
        return torch_ops.cholesky(t.to(torch.float64)).to(t.dtype)

    def eigh(self, a):
        """Symmetric eigendecomposition on the host in fp64 (no NKI eigensolver), returned in
        a's dtype; same contract as linalg.torch_ops.eigh."""
        self.record("eigh", "host-fp64")
        t = torch.as_tensor(a)
        w, v = torch_ops.eigh(t.to(torch.float64))
        return w.to(t.dtype), v.to(t.dtype)

    def inv_sqrt_spd(self, a, method="eigh", threshold=1e-10, **kwargs):
        """a^-1/2 for SPD a. 'eigh': host fp64 eigendecomposition (linalg.torch_ops.inv_sqrt_eigh,
        kwargs: relative), returned in a's dtype. 'newton_schulz': linalg.newton_schulz with every
        matrix product on the NKI GEMM kernel, fp32 (kwargs: tol, max_iter, check_every, cond_max,
        scaled, check)."""
        t = torch.as_tensor(a)
        if method == "eigh":
            self.record("inv_sqrt_spd", "host-fp64-eigh")
            x, info = torch_ops.inv_sqrt_eigh(t.to(torch.float64), threshold=threshold, **kwargs)
            info["where"] = "host-fp64"
            return x.to(t.dtype), info
        if method == "newton_schulz":
            self.record("inv_sqrt_spd", "newton_schulz(nki.gemm)")
            x, info = newton_schulz_inv_sqrt(t.to(torch.float32), matmul=self._matmul, **kwargs)
            info["kernel"] = "nki.gemm"
            return x, info
        raise ValueError(f"inv_sqrt_spd: method must be 'eigh' or 'newton_schulz', got {method!r}")

    def _matmul(self, x, y) -> torch.Tensor:
        """x @ y for 2-D tensors through the NKI GEMM kernel (fp32)."""
        return torch.from_numpy(np.ascontiguousarray(self._gemm2d(_f32(x), _f32(y), a_is_T=False)))

    # ---- fused pair energies ----
    def _occ_block_cap(self, naux: int, nvir: int, nvir_j: int | None = None) -> int:
        budget = int(0.9 * self.sbuf_partition_bytes)
        s = PAIR_MAX_OCC
        while s >= 1 and self._pair_sbuf(s, s, naux, nvir, nvir_j) > budget:
            s //= 2
        if s < 1:
            raise ValueError(
                f"mp2_pair_energy on {self.name}: nvir={nvir}, naux={naux} do not fit the pair "
                f"kernel's on-chip B_i, B_j buffers ({self._pair_sbuf(1, 1, naux, nvir)} B per "
                f"partition > {budget} B); this kernel needs nvir * ceil(naux/128) <~ "
                f"{budget // 8 // 4}"
            )
        return s

    def mp2_pair_energy(self, Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, eps_vir_j=None):
        """Contract of Backend.mp2_pair_energy, through the fused NKI pair kernel.
        K tiles, denominators and the per-partition sums are fp32 on the device; the sums
        over partitions, pairs and launches are fp64 on the host. ``eps_vir_j``: opposite
        spins (the kernel's ``opposite`` form): returns (e_os, NaN)."""
        from dfmp2.kernels.nki.mp2_pair import mp2_pair_kernel

        from .torch_ops import check_pair_shapes

        mixed = eps_vir_j is not None
        check_pair_shapes("mp2_pair_energy", Bi, Bj, symmetric, mixed)
        ni, nvir, naux = Bi.shape
        nj, nvj = Bj.shape[0], Bj.shape[1]
        if 0 in (ni, nj, nvir, nvj):
            return 0.0, (math.nan if mixed else 0.0)
        biT = np.ascontiguousarray(_f32(Bi).transpose(0, 2, 1))
        bjT = biT if symmetric else np.ascontiguousarray(_f32(Bj).transpose(0, 2, 1))
        ei = _f32(eps_i)
        ej = ei if symmetric else _f32(eps_j)
        ev = _f32(eps_vir)
        ev_col = np.ascontiguousarray(ev[:, None])
        ev_rows = np.ascontiguousarray(np.broadcast_to(_f32(eps_vir_j) if mixed else ev, (PMAX, nvj)))
        cap = self._occ_block_cap(naux, nvir, nvj) if mixed else self._occ_block_cap(naux, nvir)
        e_os = e_ss = 0.0
        for i0 in range(0, ni, cap):
            i1 = min(ni, i0 + cap)
            for j0 in range(0, (i0 + 1) if symmetric else nj, cap):
                j1 = min(nj, j0 + cap)
                diag = symmetric and i0 == j0
                part = self.runner(
                    mp2_pair_kernel,
                    biT[i0:i1],
                    bjT[j0:j1],
                    np.ascontiguousarray(np.broadcast_to(ei[i0:i1], (PMAX, i1 - i0))),
                    np.ascontiguousarray(np.broadcast_to(ej[j0:j1], (PMAX, j1 - j0))),
                    ev_col,
                    ev_rows,
                    symmetric=diag,
                    **({"opposite": True} if mixed else {}),
                )
                self.record("mp2_pair_energy", "nki.mp2_pair")
                s = part.astype(np.float64).sum(axis=0).reshape(i1 - i0, j1 - j0, 2)
                os_, x_ = s[..., 0], s[..., 1]
                if diag:
                    w = np.tril(np.full(os_.shape, 2.0), -1) + np.eye(os_.shape[0])
                elif symmetric:
                    w = np.full(os_.shape, 2.0)  # sub-block below the diagonal: (i,j) and (j,i)
                else:
                    w = np.ones(os_.shape)
                e_os += float((w * os_).sum())
                e_ss += float((w * (os_ - x_)).sum())
        return e_os, (math.nan if mixed else e_ss)

    def describe(self) -> dict:
        d = super().describe()
        d["precision"] = "fp32 (PSUM fp32 accumulation; energy sums fp64 on the host)"
        d.update({k: v for k, v in self.runner.describe().items() if k != "engine"})
        return d


def make_neuron_backend(name: str, *, simulate: bool = False, engine: str | None = None):
    """Build the trn1/trn2 backend, or raise DeviceUnavailableError naming what to install.

    engine=None picks: hardware without ``simulate``; with ``simulate``, nki.simulate when
    AWS's nki package is importable, else the NumPy emulator. An explicit ``engine`` is
    honoured or refused, never substituted.
    """
    from dfmp2.kernels.nki import engines as E

    if name not in NEURON_DEVICES:
        raise ValueError(f"unknown Trainium device '{name}'; use trn1 or trn2")
    if engine is None:
        if not simulate:
            engine = E.HARDWARE
        else:
            engine = E.NKI_SIMULATE if E.real_nki()[0] is not None else E.EMULATOR
    if engine not in E.ENGINES:
        raise ValueError(f"unknown NKI engine '{engine}'; use one of {', '.join(E.ENGINES)}")
    if (engine == E.HARDWARE) == bool(simulate):
        raise ValueError(f"engine '{engine}' contradicts simulate={simulate}")
    if engine == E.HARDWARE:
        nki, why = E.real_nki()
        if nki is None:
            raise DeviceUnavailableError(
                f"device '{name}' needs the AWS Neuron SDK, but {why}; install it on a {name} "
                f"instance with: {E.INSTALL_HINT}",
                alternatives=("simulate", "cpu"),
            )
        if not E.neuron_devices():
            raise DeviceUnavailableError(
                f"device '{name}' needs a Trainium NeuronCore but no /dev/neuron* device exists "
                f"on this machine; run on a {name} instance",
                alternatives=("simulate", "cpu"),
            )
    elif engine == E.NKI_SIMULATE:
        nki, why = E.real_nki()
        if nki is None:
            raise DeviceUnavailableError(
                f"engine nki.simulate needs AWS's nki package, but {why}; install with: {E.INSTALL_HINT}"
            )
    return NeuronBackend(name, E.KernelRunner(engine, name))
