"""Raw integrals: the fitting metric (P|Q) and 3-center (μν|P) in aux-shell blocks, from an engine.

An integral engine (``select_engine``; ``RunOptions.integrals``: auto, host, gpu4pyscf) gives, for
the orbital basis it was made with and ANY auxiliary basis (the MP2-fit set, the JK-fit set):

    engine.metric(auxmol)                      (P|Q), (naux, naux) fp64 on the backend's device
    with engine.blocks(auxmol, shell_blocks, dtype) as stream:
        for p0, p1, packed in stream:          packed (p1 - p0, npair) in ``dtype`` on the device,
            full = unpack(packed, nao)         packed[P, μ(μ+1)/2 + ν] = (μν|P), μ ≥ ν (PySCF's s2ij);
                                               full (p1 - p0, nao, nao), exact copies of those values

``packed`` is valid until the next block is asked for (its memory is reused). ``shell_blocks``:
``aux_shell_blocks(auxmol, max_functions)``. The ``with`` stops the engine's work however the loop
ends (an exception in the caller's loop, Ctrl-C); an error in the engine reaches the caller as the
same exception.

Engines:
  host       libcint through PySCF on the host CPU. ONE background thread (dfmp2.df.background)
             computes the packed blocks (ctypes releases the GIL inside libcint) into a ring of
             ``depth`` buffers (memory.QUEUE_DEPTH; pinned host memory when the device's memory
             is CUDA memory) while the caller transforms the previous block on its device (when
             the device is the host CPU itself, libcint runs in the caller's thread instead,
             depth 0: ``host_default_depth`` says why). A block crosses to the device packed,
             half the bytes of the square, and is unpacked there. The values are libcint's, bit for
             bit: the energies on the CPU are those of computing and unpacking on the host.
             Screening: libcint's own (primitive pairs below PySCF's exponent cutoff are skipped);
             PySCF offers no shell-pair screening for int3c2e on molecules, and adding our own
             would change the bits.
  gpu4pyscf  gpu4pyscf's CUDA kernels (``gpu4pyscf.df.int3c2e_bdiv``: ``int2c2e`` and
             ``compressed_aux_e2``, which screens shell pairs below 1e-14) on a CUDA device; blocks
             go from CuPy to torch by DLPack without a copy, on torch's current stream. Optional:
             ``pip install -e ".[cuda13]"`` (or ``.[cuda12]``).

Host-only helpers kept for callers that want numpy on the host: ``metric_2c``, ``iter_j3c``,
``iter_j3c_packed``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch
from pyscf import gto, lib
from pyscf.gto import moleintor

from dfmp2 import linalg
from dfmp2.df.background import Background
from dfmp2.linalg import DeviceUnavailableError
from dfmp2.memory import QUEUE_DEPTH
from dfmp2.options import INTEGRAL_ENGINES

ENGINES = INTEGRAL_ENGINES  # dfmp2.options: auto, host, gpu4pyscf
GPU4PYSCF_BLOCK_MB = 4096.0  # gpu4pyscf: target MB of a block (see Gpu4pyscfEngine.block_mb)
# The optional extra per CUDA major version: gpu4pyscf's wheels are built per CUDA major
# (gpu4pyscf-cuda12x, gpu4pyscf-cuda13x) and must match the CUDA that torch and CuPy use.
INSTALL_GPU4PYSCF = (
    'pip install -e ".[cuda13]" (gpu4pyscf-cuda13x; ".[cuda12]" for CUDA 12) on a machine with an NVIDIA GPU'
)


class EngineUnavailableError(DeviceUnavailableError):
    """The integral engine asked for cannot run here; raised before any work. The message says
    why and how to install it; ``alternatives`` ('integrals-host') what would run instead."""

    def __init__(self, message: str):
        super().__init__(message, alternatives=("integrals-host",))


# ---------------------------------------------------------------- host helpers (numpy, host)


def metric_2c(auxmol: gto.Mole) -> np.ndarray:
    """The Coulomb fitting metric j2c = (P|Q), shape (naux, naux), fp64, on the host (libcint)."""
    return np.asarray(auxmol.intor("int2c2e", hermi=1))


def aux_shell_blocks(auxmol: gto.Mole, max_functions: int) -> list[tuple[int, int, int, int]]:
    """Split the auxiliary shells into contiguous blocks of at most ``max_functions`` functions
    (a single larger shell still gets a block of its own). Returns (shl0, shl1, p0, p1) tuples."""
    ao_loc = auxmol.ao_loc_nr()
    blocks, s0 = [], 0
    for s in range(1, auxmol.nbas + 1):
        if s == auxmol.nbas or ao_loc[s + 1] - ao_loc[s0] > max_functions:
            blocks.append((s0, s, int(ao_loc[s0]), int(ao_loc[s])))
            s0 = s
    return blocks


def npair(nao: int) -> int:
    """Orbital pairs μ ≥ ν: the packed length nao(nao+1)/2."""
    return nao * (nao + 1) // 2


class _Libcint:
    """PySCF's int3c2e for (mol, auxmol): packed (μν|P) for one aux-shell range into a buffer."""

    def __init__(self, mol: gto.Mole, auxmol: gto.Mole):
        self.nbas = mol.nbas
        self.intor = mol._add_suffix("int3c2e")
        self.atm, self.bas, self.env = gto.mole.conc_env(
            mol._atm, mol._bas, mol._env, auxmol._atm, auxmol._bas, auxmol._env
        )
        self.cintopt = moleintor.make_cintopt(self.atm, self.bas, self.env, self.intor)

    def __call__(self, s0: int, s1: int, out: np.ndarray | None = None) -> np.ndarray:
        """(p1 - p0, npair) C-contiguous, fp64 (written into ``out`` when given: its first
        (p1 - p0) * npair elements)."""
        shls = (0, self.nbas, 0, self.nbas, self.nbas + s0, self.nbas + s1)
        packed = moleintor.getints(
            self.intor, self.atm, self.bas, self.env, shls, None, 0, "s2ij", None, self.cintopt, out
        )
        return packed.T  # libcint writes (npair, nb) in Fortran order: (nb, npair) in C


def iter_j3c_packed(mol: gto.Mole, auxmol: gto.Mole, blocks) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (p0, p1, packed) on the host, in this thread: packed (p1 - p0, npair) fp64, a new
    array per block (for host callers, e.g. an SCF on numpy; the pipeline uses an engine)."""
    cint = _Libcint(mol, auxmol)
    for s0, s1, p0, p1 in blocks:
        yield p0, p1, cint(s0, s1)


def iter_j3c(mol: gto.Mole, auxmol: gto.Mole, blocks) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (p0, p1, j3c) with j3c = (μν|P) for P in [p0, p1), shape (p1 - p0, nao, nao), fp64,
    on the host (libcint computes μ >= ν; the block is unpacked to the full square)."""
    for p0, p1, packed in iter_j3c_packed(mol, auxmol, blocks):
        yield p0, p1, lib.unpack_tril(packed)


# ---------------------------------------------------------------- on the device

_UNPACK_INDEX: dict = {}


def unpack_index(nao: int, device) -> torch.Tensor:
    """(nao*nao,) int64: the packed position of each (μ, ν) of the square, max(μ,ν)(max+1)/2 + min."""
    key = (nao, str(device))
    idx = _UNPACK_INDEX.get(key)
    if idx is None:
        i = torch.arange(nao, device=device)
        hi, lo = torch.maximum(i[:, None], i[None, :]), torch.minimum(i[:, None], i[None, :])
        idx = (hi * (hi + 1) // 2 + lo).reshape(-1)
        _UNPACK_INDEX.clear()  # one size at a time: the index is nao^2 int64
        _UNPACK_INDEX[key] = idx
    return idx


def pia_rows(
    packed: torch.Tensor, nao: int, C_occ: torch.Tensor, C_vir: torch.Tensor, backend, work=None
) -> torch.Tensor:
    """Rows of (P|ia) of one aux block: packed (nb, nao(nao+1)/2) (μν|P) -> (nb, nocc*nvir), half-
    transformed with C_occ (nao, nocc) then C_vir (nao, nvir) on ``backend``. The DF-MP2 stage's
    transform, in one process and over ranks alike (the same GEMMs on the same operands, so the
    same bits). Where torch computes (cpu, cuda): h[P] = C_occ^T x_P, one GEMM batched over P
    (x_P symmetric: no transposed copy of x_P C_occ), then h C_vir over (P i) rows; the tall
    x C_occ with its nocc columns runs far below the GEMM rate on some CPUs (an AMD EPYC's MKL).
    Elsewhere (trn): two 2-D GEMMs, one launch each, with the copy between.
    ``work`` (a ``memory.Buffers`` of packed's dtype and device): the unpacked block and the half-
    transformed ones in its buffers, reused from block to block (the rows returned are new: callers
    keep them or write them behind)."""
    nb, nocc, nvir = packed.shape[0], C_occ.shape[1], C_vir.shape[1]
    get = work.get if work is not None else (lambda name, shape: None)
    x = unpack(packed, nao, out=get("unpacked", (nb * nao, nao)))  # (P, μ, ν)
    if backend.caps.torch_device:
        out = get("half_t", (nb, nocc, nao))
        half = linalg.gemm(C_occ, x.view(nb, nao, nao), trans_a=True, out=out, backend=backend)  # [P, i, ν]
    else:
        half = linalg.gemm(x.view(nb * nao, nao), C_occ, out=get("half", (nb * nao, nocc)), backend=backend)  # (P μ, i)
        half = half.reshape(nb, nao, nocc).transpose(1, 2)
        halfT = get("half_t", (nb * nocc, nao))
        half = half.reshape(nb * nocc, nao) if halfT is None else halfT.view(nb, nocc, nao).copy_(half)
    return linalg.gemm(half.reshape(nb * nocc, nao), C_vir, backend=backend).reshape(nb, nocc * nvir)


def unpack(packed: torch.Tensor, nao: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """(..., npair) packed μ >= ν (PySCF's order) -> (..., nao, nao) symmetric, on packed's device
    and in its dtype; every element is an exact copy (bit for bit what PySCF's unpack_tril gives).

    ``out``: a contiguous tensor of the same dtype and device holding (..., nao*nao) elements in
    any shape (a reused buffer); the result is a view of it. fp64 in host memory: PySCF's C
    unpack_tril (faster there than torch's gather); otherwise torch's gather (index_select) on the
    device, which in host memory in fp32 is faster than PySCF's (numpy indexing outside fp64).
    Timings: scripts/results/docstring-measurements.md."""
    lead = packed.shape[:-1]
    rows = packed.reshape(-1, packed.shape[-1])
    if out is None:
        out = torch.empty(lead + (nao, nao), dtype=packed.dtype, device=packed.device)
    full = out.view(rows.shape[0], nao * nao)
    if packed.is_cpu and packed.dtype == torch.float64:
        lib.unpack_tril(rows.contiguous().numpy(), out=full.numpy())
    else:
        torch.index_select(rows, 1, unpack_index(nao, packed.device), out=full)
    return full.view(lead + (nao, nao))


# ---------------------------------------------------------------- engines


class IntegralEngine:
    """Interface (see the module docstring). ``name``: the engine; ``why``: how it was chosen."""

    name = "?"

    def __init__(self, mol: gto.Mole, backend, why: str = ""):
        self.mol, self.backend, self.why = mol, backend, why
        self.nao = mol.nao_nr()
        self.stats = {"blocks": 0, "compute_s": 0.0, "wait_s": 0.0}

    def block_mb(self, asked: float) -> float:
        """Target MB of one streamed block and its transforms (memory.plan_memory's j3c_block_mb)
        for the ``asked`` target: the engine's preference."""
        return asked

    def metric(self, auxmol: gto.Mole) -> torch.Tensor:
        raise NotImplementedError

    def blocks(self, auxmol: gto.Mole, shell_blocks, dtype=torch.float64):
        raise NotImplementedError

    def describe(self) -> dict:
        """What ran, for ``ran['integrals']``: engine, how it was chosen, its settings, and the
        seconds it computed (compute_s) and that the caller waited for blocks (wait_s)."""
        return {
            "engine": self.name,
            "why": self.why,
            **self._settings(),
            **{k: round(v, 6) if isinstance(v, float) else v for k, v in self.stats.items()},
        }

    def _settings(self) -> dict:
        return {}


class HostEngine(IntegralEngine):
    """libcint on the host; one producer thread, ``depth`` packed buffers (see the module)."""

    name = "host"

    def __init__(self, mol, backend, why: str = "", depth: int | None = None):
        super().__init__(mol, backend, why)
        if depth is None:
            depth = host_default_depth(backend)
        if depth < 0:
            raise ValueError(f"depth must be >= 0, got {depth}")
        self.depth = depth
        self.pinned = bool(backend.caps.cuda_memory)
        self.threads = lib.num_threads()  # OpenMP threads for libcint, as the caller has them

    def _settings(self) -> dict:
        return {
            "library": "libcint (PySCF getints, int3c2e s2ij)",
            "producer_threads": 1 if self.depth else 0,
            "libcint_omp_threads": self.threads,
            "queue_depth": self.depth,
            "pinned": self.pinned,
            "transfer": "packed (mu >= nu), unpacked on the device",
        }

    def metric(self, auxmol) -> torch.Tensor:
        t0 = time.perf_counter()
        j2c = metric_2c(auxmol)
        self.stats["compute_s"] += time.perf_counter() - t0
        return self.backend.to_device(j2c, torch.float64)

    def blocks(self, auxmol, shell_blocks, dtype=torch.float64):
        cint = _Libcint(self.mol, auxmol)
        if self.depth == 0:
            shell_blocks = list(shell_blocks)
            buf = _Slot(_largest_block(shell_blocks, self.nao), self.pinned).array  # fresh pages cost more

            def block(s0, s1):
                t0 = time.perf_counter()
                packed = cint(s0, s1, out=buf)
                self.stats["compute_s"] += time.perf_counter() - t0
                return self.backend.to_device(torch.from_numpy(packed), dtype)

            return _OnDemandStream(self, block, list(shell_blocks))
        return _HostStream(self, cint, list(shell_blocks), dtype)


def host_default_depth(backend) -> int:
    """The host engine's ring depth for ``backend``: QUEUE_DEPTH (a producer thread) when the
    device is not the host CPU; 0 (libcint in the caller's thread) when it is. On the host the
    producer shares the cores with the transform it would overlap: on (H2O)16 with 2 threads the
    thread made the stage slower, the transform being a small part of it
    (scripts/results/integrals_cpu.md)."""
    return 0 if backend.caps.is_host else QUEUE_DEPTH


def _largest_block(shell_blocks, nao: int) -> int:
    """Packed elements of the largest of ``shell_blocks``: the size of the engine's block buffers."""
    return max((p1 - p0 for _, _, p0, p1 in shell_blocks), default=0) * npair(nao)


class _Slot:
    """One packed buffer of the ring and the fence after which the device no longer reads it."""

    def __init__(self, numel: int, pinned: bool):
        t = torch.empty(numel, dtype=torch.float64, pin_memory=pinned)
        self.tensor, self.array = t, t.numpy()
        self.fence = None  # a torch.cuda.Event, or None (host: nothing in flight)

    def wait(self):
        if self.fence is not None:
            self.fence.synchronize()
            self.fence = None


class _HostStream:
    """The host engine's block stream: libcint on one background thread (dfmp2.df.background) into
    a ring of ``depth`` packed buffers, ``depth - 1`` blocks ahead of the one the caller holds."""

    def __init__(self, engine: HostEngine, cint: _Libcint, shell_blocks, dtype):
        self.engine, self.cint, self.dtype = engine, cint, dtype
        self.npair = npair(engine.nao)
        self.slots = [_Slot(_largest_block(shell_blocks, engine.nao), engine.pinned) for _ in range(engine.depth)]
        self.producer = Background("dfmp2-libcint", depth=engine.depth - 1)
        self.items = self.producer.map(self._compute, enumerate(shell_blocks))

    def _compute(self, item):
        """Block i into buffer i % depth (on the producer thread). The ring never hands out a
        buffer the caller still holds: at most depth - 1 blocks are ahead of its block."""
        i, (s0, s1, p0, p1) = item
        slot = self.slots[i % len(self.slots)]
        slot.wait()  # CUDA: the copy out of it has finished
        lib.num_threads(self.engine.threads)  # OpenMP settings are per thread
        t0 = time.perf_counter()
        self.cint(s0, s1, out=slot.array)
        self.engine.stats["compute_s"] += time.perf_counter() - t0
        return p0, p1, slot

    def __iter__(self):
        return self

    def __next__(self):
        t0 = time.perf_counter()
        try:
            p0, p1, slot = next(self.items)
        finally:
            self.engine.stats["wait_s"] += time.perf_counter() - t0
        packed = slot.tensor[: (p1 - p0) * self.npair].view(p1 - p0, self.npair)
        dev = self.engine.backend.to_device(packed, self.dtype)
        # a GPU copies from the pinned buffer asynchronously (linalg.cuda: a side stream); the
        # buffer is refilled only after that copy, not after the compute queued before it
        slot.fence = getattr(self.engine.backend, "last_transfer", None) if self.engine.pinned else None
        self.engine.stats["blocks"] += 1
        return p0, p1, dev

    def close(self):
        """Stop the producer and wait for it (at most the block it is computing) and for the
        device's copies out of the buffers."""
        self.items.close()
        self.producer.close()
        for slot in self.slots:
            slot.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---------------------------------------------------------------- gpu4pyscf (CUDA)


def _import_gpu4pyscf():
    """(cupy, gpu4pyscf.df.int3c2e_bdiv), or raise EngineUnavailableError saying why."""
    try:
        import cupy
        from gpu4pyscf.df import int3c2e_bdiv
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise EngineUnavailableError(
            f"integral engine gpu4pyscf is not importable ({type(exc).__name__}: "
            f"{str(exc).splitlines()[0] if str(exc) else ''}); install it with {INSTALL_GPU4PYSCF}"
        ) from None
    missing = [f for f in ("int2c2e", "compressed_aux_e2") if not hasattr(int3c2e_bdiv, f)]
    if missing:
        import gpu4pyscf

        raise EngineUnavailableError(
            f"integral engine gpu4pyscf {getattr(gpu4pyscf, '__version__', '?')} lacks "
            f"int3c2e_bdiv.{', '.join(missing)} (the engine needs gpu4pyscf 1.6 or later); install it with "
            f"{INSTALL_GPU4PYSCF}"
        )
    return cupy, int3c2e_bdiv


def to_torch(array, device=None) -> torch.Tensor:
    """A DLPack-capable array (CuPy on the GPU; numpy on the host) as a torch tensor sharing its
    memory. For CUDA arrays the caller runs CuPy on torch's current stream (``Gpu4pyscfEngine``),
    so torch's later reads are ordered after CuPy's writes; torch.from_dlpack also passes that
    stream to ``__dlpack__``, which makes it wait for the producer's stream if they differ."""
    t = torch.from_dlpack(array)
    if device is not None and t.device != torch.device(device):
        raise ValueError(f"DLPack array is on {t.device}, expected {device}")
    return t


class Gpu4pyscfEngine(IntegralEngine):
    """gpu4pyscf's 2c/3c kernels on the backend's CUDA device (see the module docstring).

    Per aux-shell block, ``compressed_aux_e2(mol, sub)`` on a Mole holding just those aux shells
    gives (npair_nz, nb) over the shell pairs that survive gpu4pyscf's screening, with their
    (row, col) in PySCF's AO order; they are scattered into the packed layout (screened pairs
    are zero). Diagonal shell pairs come in both orientations: one of each is kept (row >= col),
    so the scatter has one writer per element and the result is deterministic.
    """

    name = "gpu4pyscf"

    def __init__(self, mol, backend, why: str = ""):
        super().__init__(mol, backend, why)
        if not backend.caps.cuda_memory:
            raise EngineUnavailableError(
                f"integral engine gpu4pyscf needs a CUDA device, and '{backend.name}' is not a CUDA GPU "
                f"(on a machine with one: {INSTALL_GPU4PYSCF.split(' on a machine')[0]})"
            )
        self.cupy, self.bdiv = _import_gpu4pyscf()

    def block_mb(self, asked: float) -> float:
        """At least GPU4PYSCF_BLOCK_MB: each call sorts the basis and screens the shell pairs
        again (milliseconds), so fewer, larger blocks; GPU memory has room for them (the plan
        still shrinks them when it must)."""
        return max(asked, GPU4PYSCF_BLOCK_MB)

    def _settings(self) -> dict:
        import gpu4pyscf

        return {
            "library": f"gpu4pyscf {getattr(gpu4pyscf, '__version__', '?')} int3c2e_bdiv "
            f"(CuPy {self.cupy.__version__})",
            "transfer": "DLPack (no copy), torch's current stream",
        }

    def _stream(self):
        """CuPy on torch's current stream: one queue for both libraries."""
        return self.cupy.cuda.ExternalStream(torch.cuda.current_stream(self.backend.device).cuda_stream)

    def metric(self, auxmol) -> torch.Tensor:
        t0 = time.perf_counter()
        with self.cupy.cuda.Device(self.backend.device.index or 0), self._stream():
            j2c = to_torch(self.cupy.ascontiguousarray(self.bdiv.int2c2e(auxmol)))
        self.stats["compute_s"] += time.perf_counter() - t0
        return j2c.to(self.backend.device, torch.float64)

    def _scatter_index(self, rows: torch.Tensor, cols: torch.Tensor):
        """Which compressed rows to keep and their packed positions (on the device, per block:
        the pair list is gpu4pyscf's to choose)."""
        r, c = rows.to(torch.int64), cols.to(torch.int64)
        nao = self.nao
        transposed_present = torch.isin(c * nao + r, r * nao + c)
        keep = torch.nonzero((r >= c) | ~transposed_present).flatten()
        hi, lo = torch.maximum(r[keep], c[keep]), torch.minimum(r[keep], c[keep])
        pos = hi * (hi + 1) // 2 + lo
        if torch.unique(pos).numel() != pos.numel():
            raise RuntimeError(
                "gpu4pyscf compressed_aux_e2: a packed pair appears twice after "
                "removing transposed duplicates (unexpected pair list)"
            )
        return keep, pos

    def block(self, auxmol, s0: int, s1: int) -> torch.Tensor:
        """Packed (nb, npair) fp64 on the device for aux shells [s0, s1)."""
        sub = _aux_subset(auxmol, s0, s1)
        t0 = time.perf_counter()
        with self.cupy.cuda.Device(self.backend.device.index or 0), self._stream():
            j3c, rows, cols = self.bdiv.compressed_aux_e2(self.mol, sub)
            j3c = to_torch(self.cupy.ascontiguousarray(j3c))  # (npair_nz, nb)
            rows, cols = to_torch(rows), to_torch(cols)
            keep, pos = self._scatter_index(rows, cols)
        packed = torch.zeros((j3c.shape[1], npair(self.nao)), dtype=torch.float64, device=j3c.device)
        packed[:, pos] = j3c.index_select(0, keep).T
        self.stats["compute_s"] += time.perf_counter() - t0
        return packed

    def blocks(self, auxmol, shell_blocks, dtype=torch.float64):
        return _OnDemandStream(self, lambda s0, s1: self.block(auxmol, s0, s1).to(dtype), list(shell_blocks))


class _OnDemandStream:
    """Blocks made in the caller's thread when asked for: ``block(s0, s1)`` gives the packed
    block on the device (gpu4pyscf: the GPU queues them in order; the host engine with depth 0)."""

    def __init__(self, engine, block, shell_blocks):
        self.engine, self.block = engine, block
        self.it = iter(shell_blocks)

    def __iter__(self):
        return self

    def __next__(self):
        s0, s1, p0, p1 = next(self.it)
        packed = self.block(s0, s1)
        self.engine.stats["blocks"] += 1
        return p0, p1, packed

    def close(self):
        self.it = iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _aux_subset(auxmol: gto.Mole, s0: int, s1: int) -> gto.Mole:
    """A shallow copy of ``auxmol`` holding only its shells [s0, s1) (same atoms and env)."""
    sub = auxmol.copy(deep=False)
    sub._bas = np.asarray(auxmol._bas[s0:s1], dtype=np.int32).copy()
    return sub


# ---------------------------------------------------------------- choice


def gpu4pyscf_problem(backend) -> str | None:
    """Why the gpu4pyscf engine cannot run with ``backend``, or None when it can."""
    if not backend.caps.cuda_memory:
        return f"device '{backend.name}' is not a CUDA GPU"
    try:
        _import_gpu4pyscf()
    except EngineUnavailableError as e:
        return str(e)
    return None


def select_engine(choice: str, mol: gto.Mole, backend, *, depth: int | None = None) -> IntegralEngine:
    """The engine for ``choice`` (one of ENGINES), decided before any work. 'auto': gpu4pyscf when
    it is importable and the device is a CUDA GPU, else host. An explicit engine that cannot run
    raises EngineUnavailableError with the install command; nothing falls back."""
    if choice not in ENGINES:
        raise ValueError(f"unknown integral engine '{choice}'; use one of {', '.join(ENGINES)}")
    if choice == "host":
        return HostEngine(mol, backend, "asked for", depth=depth)
    if choice == "gpu4pyscf":
        return Gpu4pyscfEngine(mol, backend, "asked for")
    if not backend.caps.cuda_memory:
        return HostEngine(mol, backend, f"auto: device '{backend.name}' is not a CUDA GPU", depth=depth)
    problem = gpu4pyscf_problem(backend)
    if problem:
        return HostEngine(mol, backend, f"auto: gpu4pyscf not usable: {problem.split(';')[0]}", depth=depth)
    return Gpu4pyscfEngine(mol, backend, "auto: gpu4pyscf importable and a CUDA device")


def select_jk_engine(choice: str, engine: IntegralEngine, mol: gto.Mole, backend) -> IntegralEngine:
    """The engine of the DF-SCF's JK factor, given ``engine``, the one ``select_engine(choice, ...)``
    gave the run. An explicit choice is that engine for both. 'auto' that chose gpu4pyscf keeps the
    host engine for the JK factor until gpu4pyscf is measured faster there: every
    ``compressed_aux_e2`` call pays gpu4pyscf's set-up again (the orbital basis sorted, its shell
    pairs screened), and the JK factor asked for hundreds of small blocks (its exchange block size),
    which made it several times slower than libcint on an H200 while the MP2-fit set's few large
    blocks were faster (scripts/results/gpu_acceptance_h200.md). The factor now
    asks gpu4pyscf for one block per fit group (``IntegralEngine.block_mb``); scripts/gpu_acceptance.py
    times both engines there. The record says which engine ran where (``ran['scf']['integrals']``,
    ``ran['integrals']``)."""
    if choice == "auto" and engine.name == "gpu4pyscf":
        return HostEngine(
            mol, backend, "auto: host for the JK factor (gpu4pyscf's set-up per call: slower over its many blocks)"
        )
    return engine
