"""CUDA backend: torch (cuBLAS, cuSOLVER) for the dense ops, Triton kernels for the MP2 pair step
(after a cuBLAS GEMM, or fused), and pinned, double-buffered host-to-device staging on a side stream.

    backend = CudaBackend("cuda")            # what get_backend("cuda") builds (make_cuda_backend)
    e_os, e_ss = backend.mp2_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=True)

Pair-step paths (chosen per precision, recorded with the reason in describe(); never switched silently):
  "gemm+epilogue"  K blocks by torch.matmul (cuBLAS DGEMM/SGEMM), then the Triton epilogue
                   kernels/triton/pair_energy_epilogue.py (fp64 sums).
  "fused"          kernels/triton/fused_pair_energy.py: K tiles, denominators and OS/SS sums in
                   one pass; fp64 dot for fp64, fp32 dot with input_precision="ieee" (not TF32) for
                   fp32; the energy terms and sums are fp64 in both.
The rule for pair_kernel="auto": gemm+epilogue, unless scripts/bench_cuda.py has measured the fused
kernel faster on the GPU's class (compute capability) in that precision: PAIR_PATH_MEASUREMENTS
holds those numbers. pair_kernel="fused" or "gemm+epilogue" (dfmp2 run/compare --pair-kernel) is
the user's choice for both precisions. A kernel that fails to compile or launch raises KernelError
(one line: kernel, GPU or interpreter, Triton version); nothing falls back to another kernel.

"""

from __future__ import annotations

import time

import torch

from .base import CUDA_PAIR_KERNELS as PAIR_KERNELS  # what a user may ask for (--pair-kernel)
from .base import CUDA_PAIR_PATHS as PAIR_PATHS  # named in linalg.base: device_capabilities reads them
from .base import Backend, TorchBackend
from .errors import DeviceUnavailableError, KernelError

AUTO_RULE = "cuBLAS gemm+epilogue unless the fused Triton kernel was measured faster on this GPU class"
PRECISIONS = ("fp64", "fp32")
# Pair-step seconds measured by scripts/bench_cuda.py, per GPU class (compute capability): the data
# the "auto" rule reads. Shape: the (H2O)32/cc-pVDZ synthetic pair step, nocc 160, nvir 608,
# naux 2688, one symmetric call over all i >= j pairs.
PAIR_PATH_MEASUREMENTS = {
    (9, 0): {
        "gpu": "NVIDIA H100 80GB",
        "date": "2026-11",
        "versions": "torch 2.11.0+cu130, Triton 3.6.0",
        "shape": (160, 608, 2688),
        "fp64": {"gemm+epilogue": 0.656, "fused": 1.357},  # DGEMM peak 59.0 TFLOP/s: 66.1 %, 32.0 %
        "fp32": {"gemm+epilogue": 0.669, "fused": 0.793},
    }
}
PIN_MIN_BYTES = 1 << 20  # smaller transfers go through torch's plain .to()
FP32_PROBE_N = 4096  # the square GEMMs of the fp32/fp64 probe: 137 GFLOP each, milliseconds on a GPU
_FP32_SPEEDUP: dict = {}  # device -> its measured SGEMM/DGEMM ratio, once per process


def measure_fp32_speedup(device, n: int = FP32_PROBE_N, repeats: int = 3) -> float:
    """The median time of an (n, n) x (n, n) DGEMM over an SGEMM's on ``device`` (torch.matmul,
    fp32 as torch computes it: IEEE unless the caller allowed TF32, as the SCF's fp32 J/K), after a
    warm-up of each: the ratio that decides 'auto' SCF precision (dfmp2.scf.precision). On
    H100/H200-class GPUs fp64 runs on tensor cores at fp32's rate (a ratio near 1: fp64 cycles);
    on a consumer GPU it is tens."""
    dev = torch.device(device)

    def seconds(dtype) -> float:
        a = torch.ones((n, n), dtype=dtype, device=dev)
        out = torch.empty_like(a)
        times = []
        for k in range(repeats + 1):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            torch.matmul(a, a, out=out)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            if k:  # the first is the warm-up
                times.append(time.perf_counter() - t0)
        return sorted(times)[len(times) // 2]

    return seconds(torch.float64) / seconds(torch.float32)


def auto_pair_path(
    prec: str, capability: tuple[int, int] | None, measurements: dict = PAIR_PATH_MEASUREMENTS
) -> tuple[str, str]:
    """(path, why) for pair_kernel="auto": gemm+epilogue unless the fused kernel was measured faster
    on this GPU class (capability (major, minor); None: no GPU, kernels under Triton's interpreter)
    in ``measurements`` (PAIR_PATH_MEASUREMENTS's layout)."""
    if capability is None:
        return "gemm+epilogue", "auto: gemm+epilogue (no GPU: Triton interpreter; no measurement applies)"
    cls = f"sm_{capability[0]}{capability[1]}"
    m = measurements.get(tuple(capability))
    if m is None:
        return "gemm+epilogue", f"auto: gemm+epilogue (the fused kernel has not been measured faster on {cls})"
    t = m[prec]
    path = "fused" if t["fused"] < t["gemm+epilogue"] else "gemm+epilogue"
    nocc, nvir, naux = m["shape"]
    return path, (
        f"auto: {path} (measured on {cls}, {m['gpu']}, {m['date']}, {m['versions']}, "
        f"nocc/nvir/naux {nocc}/{nvir}/{naux}: gemm+epilogue {t['gemm+epilogue']:.3f} s, "
        f"fused {t['fused']:.3f} s)"
    )


def _precision(dtype: torch.dtype) -> str:
    if dtype == torch.float64:
        return "fp64"
    if dtype == torch.float32:
        return "fp32"
    raise ValueError(f"mp2_pair_energy: B must be fp32 or fp64, got {dtype}")


class _Staging:
    """One pinned host buffer and the event that marks the end of its last transfer."""

    def __init__(self):
        self.buf = None
        self.event = None
        self.src = None  # keeps an already-pinned source alive until its copy is done

    def ready(self):
        if self.event is not None:
            self.event.synchronize()
        self.src = None

    def view(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        if self.buf is None or self.buf.numel() < nbytes:
            self.buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        return self.buf[:nbytes].view(dtype)


class CudaBackend(TorchBackend):
    """CUDA GPU: torch ops plus the Triton pair kernels.

    pair_kernel: one of PAIR_KERNELS for both precisions ("auto": auto_pair_path for this GPU).
    pair_path: {'fp64'|'fp32': one of PAIR_PATHS}, per-precision choices on top (the benchmark's).
    pair_config: overrides the fused kernel's tile sizes and launch options, and gemm+epilogue's
    ``max_elems`` (the elements of K one GEMM forms: kernels.triton.pair_energy_epilogue's
    GEMM_MAX_ELEMS by default; larger row chunks, fatter GEMMs).
    The resolved path per precision is ``pair_path``, its reason ``pair_path_why`` (both in describe()).
    """

    def __init__(
        self,
        name: str = "cuda",
        *,
        pair_kernel: str = "auto",
        pair_path: dict | None = None,
        pair_config: dict | None = None,
        pin_min_bytes: int = PIN_MIN_BYTES,
        unrestricted: bool = False,
    ):
        super().__init__(name)
        self.engine = "torch+triton"
        if pair_kernel not in PAIR_KERNELS:
            raise ValueError(f"pair_kernel: expected one of {PAIR_KERNELS}, got {pair_kernel!r}")
        for prec, path in (pair_path or {}).items():
            if prec not in PRECISIONS or path not in PAIR_PATHS:
                raise ValueError(f"pair_path: expected {{'fp64'|'fp32': one of {PAIR_PATHS}}}, got {pair_path!r}")
        if unrestricted and (pair_kernel == "fused" or "fused" in (pair_path or {}).values()):
            raise ValueError(
                "pair kernel 'fused' has no opposite-spin (UHF alpha-beta) form; use "
                "--pair-kernel gemm+epilogue or auto for an open-shell run"
            )
        self.pair_path, self.pair_path_why = {}, {}
        for prec in PRECISIONS:
            if prec in (pair_path or {}):
                chosen = pair_path[prec], "chosen by the caller"
            elif unrestricted and pair_kernel == "auto":
                chosen = "gemm+epilogue", "auto: gemm+epilogue (UHF: the fused kernel has no opposite-spin form)"
            elif pair_kernel != "auto":
                chosen = pair_kernel, f"user choice (--pair-kernel {pair_kernel})"
            else:
                chosen = auto_pair_path(prec, self.capability())
            self.pair_path[prec], self.pair_path_why[prec] = chosen
        self.pair_config = dict(pair_config or {})
        self.pin_min_bytes = pin_min_bytes
        self.transfers = {"pinned": 0, "pinned_bytes": 0, "plain": 0}
        self.last_transfer = None  # event ending the latest to_device copy (None: it was synchronous)
        self._slots = None
        self._next_slot = 0
        self._copy_stream = None

    def fp32_speedup(self) -> float | None:
        """This GPU's SGEMM/DGEMM ratio, measured once per process (``measure_fp32_speedup``);
        None without a GPU (Triton's interpreter on the CPU: nothing of a GPU to measure)."""
        if self.capability() is None:
            return None
        key = str(self.device)
        if key not in _FP32_SPEEDUP:
            _FP32_SPEEDUP[key] = measure_fp32_speedup(self.device)
        return _FP32_SPEEDUP[key]

    def fused_config(self) -> dict:
        """``pair_config`` without gemm+epilogue's own key (``max_elems``): the fused kernel's."""
        return {k: v for k, v in self.pair_config.items() if k != "max_elems"}

    def capability(self) -> tuple[int, int] | None:
        """The GPU's compute capability, or None without a usable GPU (Triton's interpreter)."""
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return None
        return tuple(torch.cuda.get_device_capability(self.device))

    def where(self) -> str:
        """The GPU a kernel runs on (name and sm_XY), or Triton's interpreter."""
        from dfmp2.kernels.triton.launch import interpreting

        if interpreting():
            return "the Triton interpreter (CPU)"
        cap = self.capability()
        if cap is None:
            return f"{self.device} (no CUDA GPU)"
        return f"{torch.cuda.get_device_name(self.device)} (sm_{cap[0]}{cap[1]})"

    # ---- transfers ----
    def to_device(self, x, dtype=None) -> torch.Tensor:
        """Host array or tensor -> tensor on this GPU. Large host arrays go through one of two pinned
        staging buffers and are copied on a side stream; the current stream waits on that copy
        (an event), so the host can go on producing the next block while the copy runs and the
        GPU's compute on the previous block is not held up. A dtype cast happens on the GPU."""
        t = torch.as_tensor(x)
        nbytes = t.numel() * t.element_size()
        if self.device.type != "cuda" or t.device.type != "cpu" or nbytes < self.pin_min_bytes:
            self.transfers["plain"] += 1
            self.last_transfer = None
            return super().to_device(t, dtype)
        if self._slots is None:
            self._slots = (_Staging(), _Staging())
            self._copy_stream = torch.cuda.Stream(self.device)
        slot = self._slots[self._next_slot]
        self._next_slot ^= 1
        slot.ready()  # its previous transfer has finished
        if t.is_pinned():
            src, slot.src = t, t
        else:
            src = slot.view(t.numel(), t.dtype).view(t.shape)
            src.copy_(t)
        compute = torch.cuda.current_stream(self.device)
        with torch.cuda.stream(self._copy_stream):
            out = torch.empty(t.shape, dtype=t.dtype, device=self.device)
            out.copy_(src, non_blocking=True)
            slot.event = torch.cuda.Event()
            slot.event.record(self._copy_stream)
        compute.wait_event(slot.event)
        out.record_stream(compute)  # allocated on the copy stream, used on compute
        self.last_transfer = slot.event  # a pinned source may be reused once it has passed
        self.transfers["pinned"] += 1
        self.transfers["pinned_bytes"] += nbytes
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    # ---- the pair step ----
    def mp2_pair_energy(self, Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False, eps_vir_j=None):
        """The linalg.Backend.mp2_pair_energy contract on the Triton path chosen for B's precision.
        A kernel that fails to compile or launch raises KernelError; no other path is tried.
        Opposite spins (``eps_vir_j``) run only on gemm+epilogue (the epilogue's RECT form)."""
        prec = _precision(Bi.dtype)
        path = self.pair_path[prec]
        if eps_vir_j is not None and path == "fused":
            raise ValueError(
                "mp2_pair_energy: the fused kernel has no opposite-spin form; build the "
                "backend with unrestricted=True (gemm+epilogue)"
            )
        from dfmp2.kernels.triton.launch import interpreting

        where = f" [Triton interpreter, {Bi.device.type} tensors]" if interpreting() else ""
        if path == "fused":
            from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

            dot = "fp64 dot" if prec == "fp64" else "fp32 ieee dot"
            kernel = f"triton.fused_pair_energy({prec}: {dot}, fp64 sums)"
            self.record("mp2_pair_energy", kernel + where)
            run = lambda: fused_pair_energy(
                Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric, config=self.fused_config() or None
            )
        else:
            from dfmp2.kernels.triton.pair_energy_epilogue import gemm_epilogue_pair_energy

            gemm = (
                "DGEMM" if prec == "fp64" else ("SGEMM, TF32 ON" if torch.backends.cuda.matmul.allow_tf32 else "SGEMM")
            )
            kernel = f"torch.matmul({'cuBLAS ' if not where else ''}{gemm})+triton.pair_energy_epilogue(fp64 sums)"
            self.record("mp2_pair_energy", kernel + where)
            chunk = {"max_elems": self.pair_config["max_elems"]} if "max_elems" in self.pair_config else {}
            run = lambda: gemm_epilogue_pair_energy(
                Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric, eps_vir_j=eps_vir_j, **chunk
            )
        try:
            return run()
        except ValueError:  # the contract's argument checks: the caller's mistake
            raise
        except Exception as exc:  # Triton CompilationError, OutOfResources, a CUDA launch error
            import triton

            raise KernelError(
                f"pair-step kernel {kernel} failed on {self.where()} with Triton "
                f"{triton.__version__}: {one_line(exc)}; no other kernel was run "
                f"(pair path '{path}': {self.pair_path_why[prec]})"
            ) from exc

    def describe(self) -> dict:
        import triton

        d = Backend.describe(self)
        d["torch"] = torch.__version__
        d["torch_cuda"] = torch.version.cuda
        d["gpu"] = (
            torch.cuda.get_device_name(self.device)
            if torch.cuda.is_available()
            else "none (kernels ran under Triton's CPU interpreter)"
        )
        d["triton"] = triton.__version__
        d["pair_path"] = dict(self.pair_path)
        d["pair_path_why"] = dict(self.pair_path_why)
        if self.pair_config:
            d["pair_config"] = dict(self.pair_config)
        d["transfers"] = dict(self.transfers)
        return d


def one_line(exc: BaseException, limit: int = 400) -> str:
    """An exception as one line. Triton's CompilationError spreads a source excerpt over several
    lines: keep the offending statement and the reason (its message, or the chained cause)."""
    node = getattr(exc, "node", None)
    if hasattr(exc, "error_message") and getattr(node, "lineno", None):  # a Triton CompilationError
        src = (getattr(exc, "src", None) or "").split("\n")
        stmt = src[node.lineno - 1].strip() if node.lineno <= len(src) else "?"
        cause = exc.__cause__
        why = exc.error_message or (f"{type(cause).__name__} {cause}".strip() if cause else "")
        text = f"line {node.lineno} of the kernel function, `{stmt}`: {why}"
    else:
        text = str(exc)
    text = f"{type(exc).__name__}: {' '.join(text.split())}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def make_cuda_backend(name: str = "cuda", **kwargs) -> CudaBackend:
    """CudaBackend for an already-checked CUDA device name; a clear error when Triton is missing."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise DeviceUnavailableError(
            f"device '{name}' needs Triton for its pair-energy kernel; install it with "
            "pip install 'dfmp2[cuda]' (CUDA builds of PyTorch on Linux normally include it)"
        ) from None
    return CudaBackend(name, **kwargs)
