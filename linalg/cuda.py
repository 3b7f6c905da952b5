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

Helpers for a GPU-resident pipeline (used by scripts/bench_cuda.py; see the module's functions):
``pinned_empty`` for host buffers that libcint can fill and that transfer asynchronously,
``b_fits_on_device`` to decide whether B stays on the GPU; when it does not, ``fit_streamed`` fits
(P|ia) held in host memory one occupied block of columns at a time, and ``stream_pair_blocks``
streams the resulting B by occupied block to the pair kernel.
"""
from __future__ import annotations

import torch

from .backend import TorchBackend
from .errors import DeviceUnavailableError, KernelError

PAIR_PATHS = ("gemm+epilogue", "fused")
PAIR_KERNELS = ("auto",) + PAIR_PATHS        # what a user may ask for (--pair-kernel)
AUTO_RULE = "cuBLAS gemm+epilogue unless the fused Triton kernel was measured faster on this GPU class"
PRECISIONS = ("fp64", "fp32")
# Pair-step seconds measured by scripts/bench_cuda.py, per GPU class (compute capability): the data
# the "auto" rule reads. Shape: the (H2O)32/cc-pVDZ synthetic pair step, nocc 160, nvir 608,
# naux 2688, one symmetric call over all i >= j pairs.
PAIR_PATH_MEASUREMENTS = {
    (9, 0): {"gpu": "NVIDIA H100 80GB", "date": "2026-11", "versions": "torch 2.11.0+cu130, Triton 3.6.0",
             "shape": (160, 608, 2688),
             "fp64": {"gemm+epilogue": 0.656, "fused": 1.357},     # DGEMM peak 59.0 TFLOP/s: 66.1 %, 32.0 %
             "fp32": {"gemm+epilogue": 0.669, "fused": 0.793}},
}
PIN_MIN_BYTES = 1 << 20      # smaller transfers go through torch's plain .to()
B_DEVICE_FRACTION = 0.6      # B stays resident if it needs at most this share of free GPU memory


def auto_pair_path(prec: str, capability: tuple[int, int] | None) -> tuple[str, str]:
    """(path, why) for pair_kernel="auto": gemm+epilogue unless the fused kernel was measured faster
    on this GPU class (capability (major, minor); None: no GPU, kernels under Triton's interpreter)."""
    if capability is None:
        return "gemm+epilogue", "auto: gemm+epilogue (no GPU: Triton interpreter; no measurement applies)"
    cls = f"sm_{capability[0]}{capability[1]}"
    m = PAIR_PATH_MEASUREMENTS.get(tuple(capability))
    if m is None:
        return "gemm+epilogue", f"auto: gemm+epilogue (the fused kernel has not been measured faster on {cls})"
    t = m[prec]
    path = "fused" if t["fused"] < t["gemm+epilogue"] else "gemm+epilogue"
    nocc, nvir, naux = m["shape"]
    return path, (f"auto: {path} (measured on {cls}, {m['gpu']}, {m['date']}, {m['versions']}, "
                  f"nocc/nvir/naux {nocc}/{nvir}/{naux}: gemm+epilogue {t['gemm+epilogue']:.3f} s, "
                  f"fused {t['fused']:.3f} s)")


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
        self.src = None           # keeps an already-pinned source alive until its copy is done

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
    pair_config: overrides the fused kernel's tile sizes and launch options.
    The resolved path per precision is ``pair_path``, its reason ``pair_path_why`` (both in describe()).
    """

    def __init__(self, name: str = "cuda", *, pair_kernel: str = "auto", pair_path: dict | None = None,
                 pair_config: dict | None = None, pin_min_bytes: int = PIN_MIN_BYTES):
        super().__init__(name)
        self.engine = "torch+triton"
        if pair_kernel not in PAIR_KERNELS:
            raise ValueError(f"pair_kernel: expected one of {PAIR_KERNELS}, got {pair_kernel!r}")
        for prec, path in (pair_path or {}).items():
            if prec not in PRECISIONS or path not in PAIR_PATHS:
                raise ValueError(f"pair_path: expected {{'fp64'|'fp32': one of {PAIR_PATHS}}}, got {pair_path!r}")
        self.pair_path, self.pair_path_why = {}, {}
        for prec in PRECISIONS:
            if prec in (pair_path or {}):
                chosen = pair_path[prec], "chosen by the caller"
            elif pair_kernel != "auto":
                chosen = pair_kernel, f"user choice (--pair-kernel {pair_kernel})"
            else:
                chosen = auto_pair_path(prec, self.capability())
            self.pair_path[prec], self.pair_path_why[prec] = chosen
        self.pair_config = dict(pair_config or {})
        self.pin_min_bytes = pin_min_bytes
        self.transfers = {"pinned": 0, "pinned_bytes": 0, "plain": 0}
        self._slots = None
        self._next_slot = 0
        self._copy_stream = None

    def capability(self) -> tuple[int, int] | None:
        """The GPU's compute capability, or None without a usable GPU (Triton's interpreter)."""
        if self.device.type != "cuda" or not torch.cuda.is_available():
            return None
        return tuple(torch.cuda.get_device_capability(self.device))

    def where(self) -> str:
        """The GPU a kernel runs on (name and sm_XY), or Triton's interpreter."""
        from kernels.triton.launch import interpreting
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
            return super().to_device(t, dtype)
        if self._slots is None:
            self._slots = (_Staging(), _Staging())
            self._copy_stream = torch.cuda.Stream(self.device)
        slot = self._slots[self._next_slot]
        self._next_slot ^= 1
        slot.ready()                              # its previous transfer has finished
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
        out.record_stream(compute)                # allocated on the copy stream, used on compute
        self.transfers["pinned"] += 1
        self.transfers["pinned_bytes"] += nbytes
        return out if dtype is None or dtype == out.dtype else out.to(dtype)

    def to_host(self, t: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Device tensor -> host tensor (into ``out``, pinned, when given; synchronises)."""
        if out is None:
            return t.cpu()
        out.copy_(t)
        return out

    # ---- the pair step ----
    def mp2_pair_energy(self, Bi, Bj, eps_i, eps_j, eps_vir, *, symmetric=False):
        """The linalg.Backend.mp2_pair_energy contract on the Triton path chosen for B's precision.
        A kernel that fails to compile or launch raises KernelError; no other path is tried."""
        prec = _precision(Bi.dtype)
        path = self.pair_path[prec]
        from kernels.triton.launch import interpreting
        where = f" [Triton interpreter, {Bi.device.type} tensors]" if interpreting() else ""
        if path == "fused":
            from kernels.triton.fused_pair_energy import fused_pair_energy
            dot = "fp64 dot" if prec == "fp64" else "fp32 ieee dot"
            kernel = f"triton.fused_pair_energy({prec}: {dot}, fp64 sums)"
            self.record("mp2_pair_energy", kernel + where)
            run = lambda: fused_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric,  # noqa: E731
                                            config=self.pair_config or None)
        else:
            from kernels.triton.pair_energy_epilogue import gemm_epilogue_pair_energy
            gemm = "DGEMM" if prec == "fp64" else ("SGEMM, TF32 ON" if torch.backends.cuda.matmul.allow_tf32
                                                   else "SGEMM")
            kernel = f"torch.matmul({'cuBLAS ' if not where else ''}{gemm})+triton.pair_energy_epilogue(fp64 sums)"
            self.record("mp2_pair_energy", kernel + where)
            run = lambda: gemm_epilogue_pair_energy(Bi, Bj, eps_i, eps_j, eps_vir, symmetric=symmetric)  # noqa: E731
        try:
            return run()
        except ValueError:              # the contract's argument checks: the caller's mistake
            raise
        except Exception as exc:        # Triton CompilationError, OutOfResources, a CUDA launch error
            import triton
            raise KernelError(f"pair-step kernel {kernel} failed on {self.where()} with Triton "
                              f"{triton.__version__}: {one_line(exc)}; no other kernel was run "
                              f"(pair path '{path}': {self.pair_path_why[prec]})") from exc

    def describe(self) -> dict:
        import triton
        from .backend import Backend
        d = Backend.describe(self)
        d["torch"] = torch.__version__
        d["torch_cuda"] = torch.version.cuda
        d["gpu"] = (torch.cuda.get_device_name(self.device) if torch.cuda.is_available()
                    else "none (kernels ran under Triton's CPU interpreter)")
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
    if hasattr(exc, "error_message") and getattr(node, "lineno", None):      # a Triton CompilationError
        src = (getattr(exc, "src", None) or "").split("\n")
        stmt = src[node.lineno - 1].strip() if node.lineno <= len(src) else "?"
        cause = exc.__cause__
        why = exc.error_message or (f"{type(cause).__name__} {cause}".strip() if cause else "")
        text = f"line {node.lineno} of the kernel function, `{stmt}`: {why}"
    else:
        text = str(exc)
    text = f"{type(exc).__name__}: {' '.join(text.split())}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def make_cuda_backend(name: str = "cuda", **kwargs) -> CudaBackend:
    """CudaBackend for an already-checked CUDA device name; a clear error when Triton is missing."""
    try:
        import triton  # noqa: F401
    except ImportError:
        raise DeviceUnavailableError(
            f"device '{name}' needs Triton for its pair-energy kernel; install it with "
            "pip install 'dfmp2[cuda]' (CUDA builds of PyTorch on Linux normally include it)") from None
    return CudaBackend(name, **kwargs)


# ---- helpers for a GPU-resident pipeline ----
def pinned_empty(shape, dtype=torch.float64) -> torch.Tensor:
    """A page-locked host tensor (e.g. the target of one libcint aux-shell block), so that
    CudaBackend.to_device can copy it asynchronously without a staging memcpy."""
    return torch.empty(shape, dtype=dtype, pin_memory=True)


def b_fits_on_device(nbytes: int, device, fraction: float = B_DEVICE_FRACTION) -> bool:
    """True when B (nbytes) fits in ``fraction`` of the GPU's free memory (the rest is left for the
    transform temporaries and the pair step's workspace)."""
    free, _ = torch.cuda.mem_get_info(torch.device(device))
    return nbytes <= fraction * free


def pair_block_order(nocc: int, occ_block: int) -> list[tuple[int, int]]:
    """Block pairs (I, J), J <= I, row by row with the diagonal block first: the row's first
    upload is block I itself, which then serves as Bi for the rest of the row."""
    starts = list(range(0, nocc, occ_block))
    return [(I, J) for I in starts for J in [I] + [s for s in starts if s < I]]


def stream_pair_blocks(Bt_host: torch.Tensor, nocc: int, nvir: int, occ_block: int, backend):
    """Yield (I, J, Bi, Bj) for occupied blocks I >= J with B streamed from host memory.

    Bt_host: (naux, nocc*nvir) host tensor, Bt[P, i*nvir + a] = B_ia^P (the pipeline's layout).
    Bi, Bj: (n, nvir, naux) device views of (naux, n*nvir) blocks, the layout the pair kernel reads.
    Order: pair_block_order. Each block is uploaded through one of three pinned staging buffers on
    a side stream; the upload of the next block is issued before the current one is yielded, so
    the DMA overlaps the caller's pair kernel. At most three blocks (naux * occ_block * nvir
    elements each) are on the device at once; nblocks (nblocks + 1) / 2 uploads in all.
    On a non-CUDA backend the blocks are plain copies (so the order and views can be tested on CPU).
    """
    naux = Bt_host.shape[0]
    order = pair_block_order(nocc, occ_block)
    dev = backend.device
    cuda = dev.type == "cuda"
    copy_stream = torch.cuda.Stream(dev) if cuda else None
    slots = [_Staging() for _ in range(3)]
    counter = [0]

    def upload(s):
        n = min(occ_block, nocc - s)
        host = Bt_host[:, s * nvir:(s + n) * nvir]
        if not cuda:
            return host.to(dev).reshape(naux, n, nvir).permute(1, 2, 0), None
        slot = slots[counter[0] % 3]
        counter[0] += 1
        slot.ready()
        src = slot.view(host.numel(), host.dtype).view(host.shape)
        src.copy_(host)                                   # strided host slice -> pinned, contiguous
        with torch.cuda.stream(copy_stream):
            d = torch.empty((naux, n * nvir), dtype=host.dtype, device=dev)
            d.copy_(src, non_blocking=True)
            slot.event = torch.cuda.Event()
            slot.event.record(copy_stream)
        d.record_stream(torch.cuda.current_stream(dev))
        return d.view(naux, n, nvir).permute(1, 2, 0), slot.event

    def wait(event):
        if event is not None:
            torch.cuda.current_stream(dev).wait_event(event)

    Bi = None
    pending = upload(order[0][1]) if order else None
    for k, (I, J) in enumerate(order):
        Bj, event = pending
        wait(event)
        if I == J:
            Bi = Bj                                        # the row's first block is block I
        pending = upload(order[k + 1][1]) if k + 1 < len(order) else None
        yield I, J, Bi, Bj


def fit_streamed(M: torch.Tensor, Pia_host: torch.Tensor, nvir: int, occ_block: int, backend, *,
                 kind: str = "cholesky", out: torch.Tensor | None = None) -> torch.Tensor:
    """The fit B = L^-1 (P|ia) (kind 'cholesky', M = L lower (naux, naux)) or B = M^T (P|ia) (kind
    'eigh', M (naux, naux')) when (P|ia) and B stay in host memory: both are column-separable, so
    each occupied block's columns (naux, occ_block*nvir) are uploaded, solved on the device and
    copied back. M: on the device, in the working dtype. Pia_host: (naux, nocc*nvir) host tensor.
    out: host (naux', nocc*nvir) tensor to write into (allocated, pinned on CUDA, if None).
    Returns Bt on the host, ready for stream_pair_blocks."""
    import linalg
    naux, ncol = Pia_host.shape
    nout = M.shape[0] if kind == "cholesky" else M.shape[1]
    cuda = backend.device.type == "cuda"
    if out is None:
        out = torch.empty((nout, ncol), dtype=M.dtype, pin_memory=cuda)
    width = occ_block * nvir
    for c0 in range(0, ncol, width):
        c1 = min(ncol, c0 + width)
        cols = backend.to_device(Pia_host[:, c0:c1].contiguous(), M.dtype)
        if kind == "cholesky":
            blk = linalg.trsm(M, cols, side="left", uplo="lower", backend=backend)
        else:
            blk = linalg.gemm(M, cols, trans_a=True, backend=backend)
        out[:, c0:c1].copy_(blk)            # device -> host (synchronises)
    return out
