"""What every backend shares, below the device modules: a device name's ``Capabilities``, the
``Backend`` base class and the torch backend (CPU; ``linalg.cuda`` extends it).

``linalg.backend`` builds a backend from a device name (``get_backend``) and imports the device
modules (``linalg.cuda``, ``linalg.neuron``) only when asked for one; those modules import this one,
never ``linalg.backend``, so the layer has no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import cpu_blas as cpu_blas_module
from . import cpu_pair, torch_ops
from .newton_schulz import newton_schulz_inv_sqrt

DEVICE_NAMES = ("cpu", "cuda", "trn1", "trn2")
DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
OPS = ("gemm", "syrk", "trsm", "cholesky", "eigh", "inv_sqrt_spd", "mp2_pair_energy")
# The CUDA backend's pair-step paths (Triton kernels, linalg.cuda), named here so that a device's
# capabilities are known without importing the device module; linalg.cuda exports them as
# PAIR_PATHS and PAIR_KERNELS.
CUDA_PAIR_PATHS = ("gemm+epilogue", "fused")
CUDA_PAIR_KERNELS = ("auto",) + CUDA_PAIR_PATHS  # what a user may ask for (--pair-kernel)


@dataclass(frozen=True)
class Capabilities:
    """What a device can do, known from its name alone (no hardware is probed). Stages ask this,
    never the device's name; a new device is one more entry in ``device_capabilities``."""

    has_fp64: bool  # fp64 arithmetic on the device
    simulable: bool  # its kernels can also run on this CPU (get_backend(simulate=True))
    pair_kernels: tuple  # MP2 pair-step paths one may ask for; ('auto',) when it has one
    host_memory: bool  # its arrays live in host memory (cpu, and trn through the host)
    torch_device: bool  # torch itself computes on it (a torch.matmul peak means something)
    cuda_memory: bool = False  # its tensors are CUDA memory: CUDA libraries (cupy, gpu4pyscf) can
    # compute into them (DLPack), and host staging should be pinned
    fast_fp32: bool = False  # fp32 GEMMs markedly faster than fp64 ones (about 2x or more: a CPU's
    # SIMD width, a GPU's fp32 units): a mixed-precision SCF pays there

    @property
    def is_host(self) -> bool:
        """The host CPU itself: host libraries (scipy, PySCF) time this same device."""
        return self.host_memory and self.torch_device

    @property
    def default_precision(self) -> str:
        """The pair-step precision when none is asked for."""
        return "fp64" if self.has_fp64 else "fp32"

    def fit_dtype(self, precision: str) -> torch.dtype:
        """dtype of the transforms and the fit: fp64 wherever the device has it, whatever the pair
        step's ``precision`` (fp32 rounding of (P|ia) is amplified by the metric's condition number)."""
        return torch.float64 if self.has_fp64 else torch.float32

    def precision_problem(self, precision: str) -> str | None:
        """Why this device cannot run the pair step in ``precision``, or None when it can."""
        return None if precision != "fp64" or self.has_fp64 else "it has no fp64 arithmetic"

    def supports(self, op: str) -> bool:
        """Whether the backend implements ``op`` (one of OPS); every device implements them all."""
        return op in OPS


def device_capabilities(name: str) -> Capabilities:
    """Capabilities of a device name (cpu, cuda, cuda:N, trn1, trn2); ValueError for another name."""
    if not isinstance(name, str):
        raise ValueError(f"device name must be a string, got {name!r}")
    if name == "cpu":
        # fast_fp32 False: what 'auto' assumes where nothing measured this CPU. Where the BLAS table
        # has the SGEMM/DGEMM ratio, that decides (dfmp2.scf.precision: mixed from 1.5x; a 2-core
        # Xeon with 1.9x ran (H2O)16's DF-RHF in 17-19 s mixed against 20.5-21 s fp64).
        return Capabilities(True, False, ("auto",) + cpu_pair.PAIR_PATHS, True, True, fast_fp32=False)
    if name.split(":", 1)[0] == "cuda":
        try:
            torch.device(name)
        except RuntimeError:
            raise ValueError(f"unknown device '{name}'; use cpu, cuda, cuda:N, trn1 or trn2") from None
        return Capabilities(True, False, CUDA_PAIR_KERNELS, False, True, cuda_memory=True, fast_fp32=True)
    if name in ("trn1", "trn2"):
        return Capabilities(False, True, ("auto",), True, False)
    raise ValueError(f"unknown device '{name}'; use cpu, cuda, cuda:N, trn1 or trn2")


@dataclass
class Backend:
    """Base class. ``name`` is the user's device name, ``engine`` what executes the ops."""

    name: str
    engine: str
    kernels_used: dict = field(default_factory=dict)
    flops: dict = field(default_factory=dict)  # {op: flops executed}, charged by linalg.ops (linalg.flops)

    @property
    def caps(self) -> Capabilities:
        return device_capabilities(self.name)

    @property
    def has_fp64(self) -> bool:
        return self.caps.has_fp64

    @property
    def default_precision(self) -> str:
        return self.caps.default_precision

    def fit_dtype(self, precision: str) -> torch.dtype:
        return self.caps.fit_dtype(precision)

    def supports(self, op: str) -> bool:
        return self.caps.supports(op)

    def record(self, op: str, kernel: str) -> None:
        """Note that ``op`` ran through ``kernel`` (counts calls)."""
        key = f"{op}:{kernel}"
        self.kernels_used[key] = self.kernels_used.get(key, 0) + 1

    def count_flops(self, op: str, n: int) -> None:
        """Charge ``n`` flops (linalg.flops' count of one call) to ``op``."""
        self.flops[op] = self.flops.get(op, 0) + int(n)

    def flops_executed(self) -> int:
        """All flops charged to this backend so far (every op): ``dfmp2.timing.Timer`` reads it
        before and after each stage."""
        return sum(self.flops.values())

    def fp32_speedup(self) -> float | None:
        """This machine's measured SGEMM/DGEMM ratio, or None where nothing measured it (then the
        capabilities' ``fast_fp32`` says it): what decides a mixed-precision SCF (dfmp2.scf.precision)."""
        return None

    def describe(self) -> dict:
        """What ran, for results and benchmark rows."""
        return {"device": self.name, "engine": self.engine, "kernels": dict(sorted(self.kernels_used.items()))}


class TorchBackend(Backend):
    """CPU and CUDA through PyTorch. On the CPU, GEMM, SYRK and the pair step's GEMMs run on torch's
    BLAS or numpy's OpenBLAS as ``cpu_blas`` says (linalg.cpu_blas: 'auto' measures, 'torch' and
    'openblas' force); other devices take only 'auto' (their own kernels)."""

    def __init__(self, name: str = "cpu", cpu_blas: str = "auto", pair_kernel: str = "auto"):
        super().__init__(name=name, engine="torch")
        self.device = torch.device(name)
        cpu_blas_module.check_choice(cpu_blas, name, self.device.type == "cpu")
        self.blas = cpu_blas_module.CpuBlas(cpu_blas) if self.device.type == "cpu" else None
        self.pair_path = self.pair_path_why = None  # {precision: path} on the CPU (linalg.cpu_pair)
        if self.device.type == "cpu":
            path, why = cpu_pair.choose(pair_kernel)  # KernelError now when its C epilogue cannot be built
            self.pair_path = {"fp64": path, "fp32": path}
            self.pair_path_why = {"fp64": why, "fp32": why}

    def to_device(self, x, dtype=None) -> torch.Tensor:
        """Host array or tensor -> tensor on this backend's device."""
        t = torch.as_tensor(x)
        return t.to(device=self.device, dtype=dtype if dtype is not None else t.dtype)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ---- ops (implementations in linalg.torch_ops; contracts in linalg.ops) ----
    def fp32_speedup(self) -> float | None:
        """The host CPU's: its BLAS probe's large SGEMM over large DGEMM, each of the library that runs
        it (linalg.cpu_blas.CpuBlas.fp32_speedup); None on another device."""
        return self.blas.fp32_speedup() if self.blas is not None else None

    def gemm(self, a, b, *, trans_a=False, trans_b=False, alpha=1.0, beta=0.0, out=None):
        if self.blas is not None and (out is None or beta == 0.0):
            ran = self.blas.matmul(a.mT if trans_a else a, b.mT if trans_b else b, "gemm", out)
            if ran is not None:
                self.record("gemm", ran[1])
                return ran[0].mul_(alpha) if alpha != 1.0 else ran[0]
        self.record("gemm", "torch.matmul")
        return torch_ops.gemm(a, b, trans_a=trans_a, trans_b=trans_b, alpha=alpha, beta=beta, out=out)

    def syrk(self, a, *, trans=False, alpha=1.0, uplo="lower", full=True):
        n, k = (a.shape[-1], a.shape[-2]) if trans else (a.shape[-2], a.shape[-1])
        if self.blas is not None and a.ndim == 2 and uplo in ("lower", "upper"):
            A = a.mT if trans else a
            ran = self.blas.matmul(A, A.mT, "syrk")  # numpy: SYRK, mirrored (exactly symmetric)
            if ran is not None:
                self.record("syrk", ran[1])
                c = ran[0].mul_(alpha) if alpha != 1.0 else ran[0]
                return c if full else torch_ops.syrk_triangle(c, uplo)
        blocked = len(torch_ops.syrk_blocks(n, k)) > 1
        self.record("syrk", "torch.matmul(block-triangle)" if blocked else "torch.matmul")
        return torch_ops.syrk(a, trans=trans, alpha=alpha, uplo=uplo, full=full)

    def trsm(self, a, b, *, side="left", uplo="lower", trans=False, unit_diagonal=False, overwrite_b=False):
        self.record("trsm", "torch.linalg.solve_triangular")
        out = b if overwrite_b else None
        return torch_ops.trsm(a, b, side=side, uplo=uplo, trans=trans, unit_diagonal=unit_diagonal, out=out)

    def cholesky(self, a):
        self.record("cholesky", "torch.linalg.cholesky_ex")
        return torch_ops.cholesky(a)

    def eigh(self, a):
        self.record("eigh", "torch.linalg.eigh")
        return torch_ops.eigh(a)

    def inv_sqrt_spd(self, a, method="eigh", threshold=1e-10, **kwargs):
        """a^{-1/2}: method 'eigh' (kwargs: relative) or 'newton_schulz' (kwargs: tol, max_iter,
        check_every, cond_max, scaled, check; see linalg.newton_schulz). Returns (X, info)."""
        if method == "eigh":
            self.record("inv_sqrt_spd", "torch.linalg.eigh")
            return torch_ops.inv_sqrt_eigh(a, threshold=threshold, **kwargs)
        if method == "newton_schulz":
            self.record("inv_sqrt_spd", "newton_schulz(torch.matmul)")
            return newton_schulz_inv_sqrt(a, matmul=torch.matmul, **kwargs)
        raise ValueError(f"inv_sqrt_spd: method must be 'eigh' or 'newton_schulz', got {method!r}")

    def mp2_pair_energy(self, Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, eps_vir_j=None):
        """MP2 opposite- and same-spin sums over all pairs (i, j) in I x J.

        Bi: (ni, nvir, naux), Bj: (nj, nvir, naux) fitted integrals B_ia^P in working precision.
        eps_i (ni,), eps_j (nj,), eps_vir (nvir,): orbital energies in Hartree, fp64.
        symmetric=True means Bj is Bi (a diagonal block): only i >= j is computed, i > j
        counted twice, and the result is still the full I x I sum.
        Returns (e_os, e_ss) as Python floats in Hartree, accumulated in fp64:
            e_os = sum_ij sum_ab K_ab^2 / D,   e_ss = sum_ij sum_ab K_ab (K_ab - K_ba) / D,
            K = B_i B_j^T, D = eps_i + eps_j - eps_a - eps_b.
        eps_vir_j (nvir_j,): i and j have opposite spins (UMP2's alpha-beta block): Bj is
        (nj, nvir_j, naux) over its own virtuals b, K is (nvir, nvir_j), symmetric must be False,
        and the result is (e_os, NaN): the exchange term does not exist between spins.
        """
        if self.pair_path is None:  # cuda tensors on the plain torch backend
            self.record("mp2_pair_energy", "torch.matmul(rows)+torch")
            return torch_ops.mp2_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric, eps_vir_j=eps_vir_j)
        tiles = self.pair_path["fp32" if Bi.dtype == torch.float32 else "fp64"] == "gemm+epilogue"
        shape = cpu_pair.gemm_shape(tiles, Bi, Bj, symmetric)
        ob = self.blas.pair(Bi, Bj, *shape, "tiles" if tiles else "rows") if shape else None
        gemm = ob.pop("kernel") if ob else f"torch.matmul({'tiles' if tiles else 'rows'})"
        self.record("mp2_pair_energy", gemm + ("+pair_epilogue.c(fp64 sums)" if tiles else "+torch"))
        run = cpu_pair.mp2_pair_energy if tiles else torch_ops.mp2_pair_energy
        return run(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric, eps_vir_j=eps_vir_j, **(ob or {}))

    def describe(self) -> dict:
        d = super().describe()
        d["torch"] = torch.__version__
        if self.device.type == "cpu":
            d["threads"] = torch.get_num_threads()
            d["cpu_blas"] = self.blas.describe()
            d["pair_path"] = dict(self.pair_path)
            d["pair_path_why"] = dict(self.pair_path_why)
            if "gemm+epilogue" in self.pair_path.values():
                d["pair_epilogue"] = cpu_pair.epilogue_info()
        if self.device.type == "cuda":
            d["gpu"] = torch.cuda.get_device_name(self.device)
        return d
