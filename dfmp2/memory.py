"""Memory planning: estimate the peak of each stage from the shapes, choose block sizes, and decide
whether B (the fitted integrals) stays in memory or goes to disk (HDF5, ``dfmp2.df.outofcore``).

Estimates are in MB (10^6 bytes) of the memory the big arrays live in (host for cpu and trn, the
GPU for cuda). The plan is made before the SCF, so a run that cannot fit fails at once with the
minimum it needs. Not modelled: PySCF's own SCF memory (its ``max_memory``) and the interpreter,
libraries and molecule (0.3-0.5 GB resident), which the default limit's safety fraction leaves room
for; the plan records them as ``process_mb`` (resident when it was made), so the process's peak is
about ``peak_mb + process_mb``, and glibc's freed heap pages go back at each stage's end
(``release_freed``).

Block sizes are chosen from the shapes first (``occ_block_max``, ``j3c_block_mb``: by default
``OCC_BLOCK_MAX``, ``J3C_BLOCK_MB``) and shrunk only
when the limit forces it; whether B is on disk never changes them. Same blocks means the same
arithmetic in the same order, which is what makes the out-of-core energy bitwise equal to the
in-memory one (``dfmp2.df.outofcore``).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dfmp2.errors import InputError, MemoryLimitError
from dfmp2.linalg.torch_ops import PAIR_CHUNK_ELEMS

MB = 1e6
DEFAULT_FRACTION = 0.8  # of available memory when no limit is given
OCC_BLOCK_MAX = 16  # occupied orbitals per block of the fit and the pair step
# on a GPU (caps.cuda_memory): one block up to this many (the memory plan shrinks it when it must).
# The pair step's GEMMs grow with the block; an H200 ran (H2O)32's pair step, 55 calls of 16-orbital
# blocks, in 1.3-3.2 s, against 0.66 s for one call over all 160 (the synthetic pair_peak). Not
# measured in a whole run yet: scripts/bench_cuda.py times both blockings in every run
OCC_BLOCK_MAX_GPU = 256


def occ_block_max(given: int | None, caps) -> int:
    """The occupied block's upper bound: ``given`` (RunOptions.occ_block_max), else the device's:
    OCC_BLOCK_MAX_GPU where its memory is a GPU's, OCC_BLOCK_MAX elsewhere."""
    if given is not None:
        return given
    return OCC_BLOCK_MAX_GPU if caps.cuda_memory else OCC_BLOCK_MAX


J3C_BLOCK_MB = 512.0  # target size of one streamed (μν|P) block and its transforms
PREFETCH_DEPTH = 2  # out-of-core blocks read ahead of the one in use (outofcore.py)
WRITE_DEPTH = 2  # out-of-core writes queued behind the one in flight
QUEUE_DEPTH = 2  # the host integral engine's packed (μν|P) buffers (dfmp2.df.integrals)
STORAGE_CHOICES = ("auto", "memory", "disk")
STAGES = ("metric", "transform", "fit", "pair")


def local_ranks() -> int:
    """The processes of this run on this node (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def default_limit_mb(device: str) -> float:
    """The limit of a run without ``--memory``: DEFAULT_FRACTION of the memory available on
    ``device`` (``available_mb``), divided among this node's ranks (``local_ranks``) where the big
    arrays live in host memory: every rank of a node starts seeing the same free memory, and they
    all fill it. A GPU's memory is its own rank's (one GPU per rank). ``--memory`` stays per rank."""
    from dfmp2 import linalg

    share = local_ranks() if linalg.device_capabilities(device).host_memory else 1
    return DEFAULT_FRACTION * available_mb(device) / share


def peak_rss_mb() -> float:
    """This process's high-water mark of resident memory so far, MB (10^6 B): getrusage's
    ru_maxrss (KiB on Linux, bytes on macOS), the number the acceptance of a memory limit is
    measured by."""
    import resource
    import sys

    unit = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * unit / MB


def resident_mb() -> float:
    """This process's resident memory now, MB (10^6 B): /proc/self/statm's resident pages; where
    there is no /proc (macOS), the high-water mark so far (``peak_rss_mb``), an upper bound."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MB
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


@functools.cache
def _glibc():
    """The C library if it is glibc (has ``malloc_trim``), else None; looked up once."""
    import ctypes
    import ctypes.util

    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
        lib.gnu_get_libc_version.restype = ctypes.c_char_p
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to trim
        return None
    return lib


def release_freed() -> bool:
    """Hand the pages of freed heap memory back to the OS (glibc's ``malloc_trim(0)``); False
    where the C library is not glibc. Called at every stage's end (``timing.Timer.add``).

    Why: glibc serves blocks below its mmap threshold from its heaps, and the threshold rises to
    32 MB as large blocks are freed, so the freed (μν|P) pieces, transforms and solver
    temporaries of one phase stay resident, unused, while the next phase maps its own blocks:
    the process's peak RSS ran 0.3-0.6 GB above the plan's arrays at --memory 2000. A fixed 1 MB
    threshold (MALLOC_MMAP_THRESHOLD_) removed most of that but maps and faults every temporary
    anew (a whole run about a fifth slower); trimming once per stage costs one walk of the heap
    and the faults of pages used again (scripts/results/memory_rss.md)."""
    lib = _glibc()
    if lib is None:
        return False
    lib.malloc_trim(0)
    return True


def allocator() -> str:
    """What the run's heap memory is handed back by, for the result's memory record."""
    lib = _glibc()
    if lib is None:
        return "the C library's malloc (not glibc): freed memory as it decides"
    version = lib.gnu_get_libc_version().decode()
    return f"glibc {version} malloc, freed heap pages handed back at each stage's end (malloc_trim)"


def human(mb: float) -> str:
    """Megabytes (10^6 B) in the unit a person reads: '750 MB', '59.4 GB', '1.2 TB' (3 digits)."""
    for unit, scale in (("PB", 1e9), ("TB", 1e6), ("GB", 1e3)):
        if abs(mb) >= scale:
            return f"{mb / scale:.3g} {unit}"
    return f"{mb:.3g} MB"


def available_mb(device: str) -> float:
    """Available memory on the device the big arrays live on (host for cpu and trn). On the host,
    the smallest of what the machine has free (/proc/meminfo), what the address-space limit
    (``ulimit -v``) leaves and what the cgroup's limit (a container's, a batch job's) leaves."""
    from dfmp2 import linalg

    if not linalg.device_capabilities(device).host_memory:
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return free / MB
    return min(mb for mb in (meminfo_mb(), rlimit_mb(), cgroup_mb()) if mb is not None)


def meminfo_mb(path="/proc/meminfo") -> float:
    """MemAvailable of /proc/meminfo (or the free pages sysconf counts where it is missing)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / MB
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") / MB


def rlimit_mb(status="/proc/self/status") -> float | None:
    """What the soft address-space limit (RLIMIT_AS, ``ulimit -v``) leaves beyond the address
    space already mapped (VmSize); None when there is no limit."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    used = 0
    try:
        with open(status) as f:
            used = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmSize:")), 0)
    except (OSError, ValueError, IndexError):
        pass
    return max(soft - used, 0) / MB


CGROUP_UNLIMITED = 1 << 62  # cgroup v1 writes 'no limit' as a page-rounded 2**63 - 1


def cgroup_mb(root="/sys/fs/cgroup", proc="/proc/self/cgroup") -> float | None:
    """What the memory limits of this process's cgroup and its ancestors leave (limit minus
    usage, the smallest): cgroup v2 ``memory.max`` - ``memory.current``, v1
    ``memory.limit_in_bytes`` - ``memory.usage_in_bytes``. None without a limit."""
    try:
        with open(proc) as f:
            entries = [ln.rstrip("\n").split(":", 2) for ln in f]
    except OSError:
        entries = []
    found = []
    for e in entries:
        if len(e) != 3:
            continue
        if e[0] == "0" and e[1] == "":  # v2: '0::/path'
            found += _cgroup_left(Path(root), e[2], "memory.max", "memory.current")
        elif "memory" in e[1].split(","):  # v1: 'N:memory:/path'
            found += _cgroup_left(Path(root) / "memory", e[2], "memory.limit_in_bytes", "memory.usage_in_bytes")
    return min(found) / MB if found else None


def _cgroup_left(base: Path, rel: str, limit_file: str, usage_file: str) -> list:
    """Bytes left under the limit of cgroup ``rel`` and of each ancestor found under ``base``
    (a container may see only part of the tree); unlimited or unreadable ones left out."""
    left, start = [], base / rel.strip("/")
    for d in [start, *start.parents]:
        try:
            limit = (d / limit_file).read_text().strip()
            usage = int((d / usage_file).read_text().strip())
        except (OSError, ValueError):
            limit = None
        if limit not in (None, "max") and limit.isdigit() and int(limit) < CGROUP_UNLIMITED:
            left.append(max(int(limit) - usage, 0))
        if d == base:
            break
    return left


def pair_workspace_bytes(nrows: int, nvir: int) -> int:
    """Bytes of one thread's pair-step workspace for rows of ``nrows`` occupied orbitals: ~7 fp64
    chunks of K, each at most PAIR_CHUNK_ELEMS elements (linalg.torch_ops.mp2_pair_energy's
    chunk, the gemm+torch path) but at least one nvir x nvir block; or, where larger, the CPU's
    gemm+epilogue path's one tile in flight (linalg.cpu_pair.workspace_elems, fp64)."""
    from dfmp2.linalg.cpu_pair import workspace_elems

    return 8 * max(
        7 * min(nrows * nvir * nvir, max(PAIR_CHUNK_ELEMS, nvir * nvir)), workspace_elems(nrows, nrows, nvir, nvir)
    )


def synthetic_memory_mb(nocc: int, nvir: int, naux: int, itemsize: int, nthreads: int = 1) -> dict:
    """MB (10^6 bytes) a synthetic problem needs: 'generate' (host: B in the working precision
    plus a few fp64 (nvir, naux) Philox work arrays) and 'pair' (on the device: B plus the
    pair step's workspace for each thread, ``pair_workspace_bytes``)."""
    b = nocc * nvir * naux * itemsize
    ws = min(max(1, nthreads), nocc) * pair_workspace_bytes(nocc, nvir)
    return {"b": b / MB, "generate": (b + 6 * nvir * naux * 8) / MB, "pair": (b + ws) / MB}


def check_synthetic_memory(what: str, nocc: int, nvir: int, naux: int, itemsize: int, devices) -> None:
    """Refuse (InputError, before anything is allocated) a synthetic problem (dfmp2 compare
    --synthetic, dfmp2 bench --shapes) larger than the free memory: the host, where it is
    generated, and each device that will run it (cpu and trn run on the host). ``what``: the
    option and value, for the message (e.g. '--synthetic 8,40,120')."""
    import torch

    need = synthetic_memory_mb(nocc, nvir, naux, itemsize, torch.get_num_threads())
    for where, mb in [("host", need["generate"])] + [(d, need["pair"]) for d in devices]:
        have = default_limit_mb(where if where != "host" else "cpu")
        if mb > have:
            raise InputError(
                f"{what}: needs about {human(mb)} on {where} (B alone {human(need['b'])}) "
                f"but {human(have)} is available ({DEFAULT_FRACTION:.0%} of free memory); "
                f"choose smaller sizes"
            )


@dataclass
class MemoryPlan:
    """What the run will do and what it needs. Memory in MB; blocks in functions / orbitals."""

    limit_mb: float
    peak_mb: float
    aux_block: int  # max auxiliary functions per streamed (μν|P) block
    occ_block: int  # occupied orbitals per block of the fit and the pair step
    stages_mb: dict  # peak of each stage (metric, transform, fit, pair) with these blocks
    out_of_core: bool = False  # B (and (P|ia)) on disk in HDF5 rather than in memory
    disk_mb: float = 0.0  # scratch disk the out-of-core arrays need (0 in memory)
    in_memory_mb: float = 0.0  # what keeping B in memory would need with these blocks
    min_mb: float = 0.0  # the smallest feasible plan (out of core, smallest blocks)
    storage: str = "auto"  # what was asked: auto, memory or disk
    shapes: dict = field(default_factory=dict)
    integrals: dict = field(default_factory=dict)  # engine, queue_depth, host_mb outside the plan
    allocator: str = field(default_factory=lambda: allocator())  # how freed memory leaves the process
    # resident when the plan was made (interpreter, libraries, molecule): outside the plan's arrays,
    # which --memory bounds, so the process's peak is about peak_mb + process_mb
    process_mb: float = field(default_factory=resident_mb)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def b_mb(self) -> float:
        """Size of B in the pair step's precision."""
        s = self.shapes
        return s.get("naux", 0) * s.get("nocc", 0) * s.get("nvir", 0) * s.get("itemsize", 8) / MB


def j3c_engine_bytes(
    engine: str, *, nao: int, fit_itemsize: int, host_memory: bool, depth: int = QUEUE_DEPTH
) -> tuple[int, int]:
    """Bytes per auxiliary function of one streamed (μν|P) block before its transforms, for an
    integral engine (dfmp2.df.integrals): (in the plan's memory, in host memory outside the plan).
    The second is nonzero only when the plan's memory is a GPU's (``host_memory`` False).

    host:      ``depth`` packed fp64 buffers on the host (pinned for a GPU), the packed block on
               the device (a GPU's copy; on a host device only a cast to a narrower fit dtype
               copies), the unpacked square in the fit dtype.
    gpu4pyscf: on the GPU, about three packed-sized fp64 arrays (CuPy's compressed block before and
               after its auxiliary contraction, torch's packed block) and the unpacked square.
    """
    pair = nao * (nao + 1) // 2
    square = nao * nao * fit_itemsize
    if engine == "gpu4pyscf":
        return 3 * pair * 8 + square, 0
    if engine != "host":
        raise ValueError(f"unknown integral engine {engine!r}")
    ring = max(depth, 1) * pair * 8  # depth 0: one block, made in the caller's thread
    if host_memory:
        return ring + (pair * fit_itemsize if fit_itemsize != 8 else 0) + square, 0
    return pair * 8 + square, ring


def stage_estimates(  # noqa: PLR0913
    *,
    nao: int,
    nocc: int,
    nvir: int,
    naux: int,
    itemsize: int,
    fit_itemsize: int,
    aux_block: int,
    occ_block: int,
    out_of_core: bool,
    j3c_per_aux: int | None = None,
) -> dict:
    """Peak MB of each stage with what is resident during it.

    metric:    j2c on the host and the device, its factor (eigh needs about one more).
    transform: L, the streamed (μν|P) block (the integral engine's working memory per auxiliary
               function, ``j3c_per_aux`` bytes, see ``j3c_engine_bytes``; default: packed on the
               host, unpacked, device copy), its half-transform (and the transposed copy), its
               (P|ia) rows; plus all of (P|ia) in memory, or the queued disk writes out of core.
    fit:       L, (P|ia) being replaced block by block by B in memory (or the read-ahead blocks out
               of core), one column block's trsm output and its cast, queued writes.
    pair:      B in memory (or the blocks Bi, Bj and those read ahead), the pair kernel's workspace.
    """
    fw, w = fit_itemsize, itemsize
    nov = nocc * nvir
    bcols = occ_block * nvir
    ab = aux_block
    mo = 2 * nao * nao * 8  # C (host and device)
    L = naux * naux * 8 + (naux * naux * fw if fw != 8 else 0)
    pia_all = naux * nov * fw
    b_all = naux * nov * w
    blk_f, blk_w = naux * bcols * fw, naux * bcols * w
    if j3c_per_aux is None:
        j3c_per_aux = nao * (nao + 1) // 2 * 8 + nao * nao * 8 + nao * nao * fw
    j3c = ab * (j3c_per_aux + 2 * nao * nocc * fw + 2 * nov * fw)
    nblk = -(-nocc // occ_block)
    ahead = min(PREFETCH_DEPTH, nblk)  # blocks read ahead
    ws = pair_workspace_bytes(occ_block, nvir)
    st = {"metric": 4 * naux * naux * 8 + mo}
    if out_of_core:
        st["transform"] = mo + L + j3c + WRITE_DEPTH * ab * bcols * fw  # queued row pieces
        st["fit"] = mo + L + (ahead + 2) * blk_f + (min(WRITE_DEPTH, nblk) + 1) * blk_w
        st["pair"] = mo + (ahead + min(2, nblk)) * blk_w + ws
    else:
        st["transform"] = mo + L + j3c + pia_all
        st["fit"] = mo + L + max(pia_all, b_all) + blk_f + blk_w
        st["pair"] = mo + b_all + ws
    return {k: v / MB for k, v in st.items()}


def _fit(shapes, aux_block, occ_block, aux_min, out_of_core, limit, occ_fixed=False):
    """Shrink the blocks of the stage at the peak until the plan fits; (aux_block, occ_block, stages,
    fits) of the first plan that fits, or of the smallest one when none does."""
    a, o = aux_block, occ_block
    o_min = occ_block if occ_fixed else 1
    while True:
        st = stage_estimates(**shapes, aux_block=a, occ_block=o, out_of_core=out_of_core)
        peak = max(st.values())
        if peak <= limit:
            return a, o, st, True
        top = max(st, key=st.get)
        if top == "transform" and a > aux_min:
            a = max(aux_min, a // 2)
        elif top in ("fit", "pair") and o > o_min:
            o = max(o_min, o // 2)
        elif a > aux_min and top != "metric":
            a = max(aux_min, a // 2)
        elif o > o_min and top != "metric":
            o = max(o_min, o // 2)
        else:
            return a, o, st, False


def plan_memory(  # noqa: PLR0913
    *,
    nao: int,
    nocc: int,
    nvir: int,
    naux: int,
    itemsize: int,
    limit_mb: float | None,
    device: str = "cpu",
    fit_itemsize: int = 8,
    storage: str = "auto",
    aux_shell_max: int = 1,
    occ_block: int | None = None,
    occ_block_max: int = OCC_BLOCK_MAX,
    j3c_block_mb: float = J3C_BLOCK_MB,
    engine: str = "host",
    queue_depth: int = QUEUE_DEPTH,
) -> MemoryPlan:
    """Choose block sizes and where B lives so the run fits ``limit_mb`` (default: a safe fraction
    of what is free on ``device``).

    itemsize: bytes per element of B in the pair step (8 fp64, 4 fp32); fit_itemsize: of (P|ia)
    and the fit (8, or 4 on trn). storage: 'auto' (in memory when it fits, else on disk),
    'memory' or 'disk' (forced). aux_shell_max: functions in the largest auxiliary shell (a shell
    is never split). occ_block: fixed occupied block (a resumed checkpoint's), else chosen, at
    most occ_block_max; j3c_block_mb: target MB of one streamed (μν|P) block (the block size
    follows from it as before any engine existed, so the blocks, hence the bits, do not depend on
    the engine). engine ('host' or 'gpu4pyscf', dfmp2.df.integrals) and queue_depth: whose working
    memory the transform stage holds (``j3c_engine_bytes``); host memory outside the plan (the
    host engine's pinned buffers for a GPU) is ``plan.integrals['host_mb']``.
    Raises MemoryLimitError, naming the minimum needed, when even the smallest plan does not fit.
    """
    if storage not in STORAGE_CHOICES:
        raise ValueError(f"storage must be one of {STORAGE_CHOICES}, got {storage!r}")
    limit = limit_mb if limit_mb is not None else default_limit_mb(device)
    nocc, nvir, naux = max(1, nocc), max(1, nvir), max(1, naux)
    shapes = dict(nao=nao, nocc=nocc, nvir=nvir, naux=naux, itemsize=itemsize, fit_itemsize=fit_itemsize)
    aux_min = max(1, min(naux, aux_shell_max))
    from dfmp2 import linalg

    host_memory = linalg.device_capabilities(device).host_memory
    in_plan, outside = j3c_engine_bytes(
        engine, nao=nao, fit_itemsize=fit_itemsize, host_memory=host_memory, depth=queue_depth
    )
    est = dict(shapes, j3c_per_aux=in_plan)  # what the stages hold with this engine
    aux0 = _first_aux_block(shapes, aux_min, j3c_block_mb)
    occ0 = max(1, min(nocc, occ_block if occ_block else occ_block_max))
    fixed_occ = occ_block is not None
    found = _blocks_that_fit(est, storage, aux0, occ0, aux_min, limit, fixed_occ)
    if found is None:
        raise _too_small(est, storage, aux_min, occ0, fixed_occ, limit)
    ooc, a, o, st = found
    im = max(stage_estimates(**est, aux_block=a, occ_block=o, out_of_core=False).values())
    disk = 0.0
    if ooc:
        disk = naux * nocc * nvir * (itemsize + (fit_itemsize if fit_itemsize != itemsize else 0)) / MB
    return MemoryPlan(
        limit_mb=limit,
        peak_mb=max(st.values()),
        aux_block=a,
        occ_block=o,
        stages_mb=st,
        out_of_core=ooc,
        disk_mb=disk,
        in_memory_mb=im,
        min_mb=_min_mb(est, aux_min, occ0 if fixed_occ else 1, storage),
        storage=storage,
        shapes=shapes,
        integrals={
            "engine": engine,
            "queue_depth": queue_depth if engine == "host" else 0,
            "host_mb": a * outside / MB,
        },
    )


def _first_aux_block(shapes: dict, aux_min: int, j3c_block_mb: float) -> int:
    """The auxiliary block the shapes choose: as many functions as make one streamed (μν|P) block
    and its transforms about ``j3c_block_mb`` (at least the largest shell, at most naux)."""
    per_aux_fn = (
        stage_estimates(**shapes, aux_block=1, occ_block=1, out_of_core=True)["transform"]
        - stage_estimates(**shapes, aux_block=0, occ_block=1, out_of_core=True)["transform"]
    )
    return int(max(aux_min, min(shapes["naux"], j3c_block_mb / max(per_aux_fn, 1e-12))))


def _blocks_that_fit(est: dict, storage: str, aux0: int, occ0: int, aux_min: int, limit: float, fixed_occ: bool):
    """(out_of_core, aux_block, occ_block, stages) of the first of ``storage``'s attempts that fits
    ``limit``, or None. auto: in memory with the shape-chosen blocks, else on disk with the same
    blocks (shrunk only if even that does not fit), so the memory limit changes the bits of the
    energy only when it is below what those blocks need out of core."""
    attempts = {"auto": ((False, False), (True, True)), "memory": ((False, True),), "disk": ((True, True),)}[storage]
    for ooc, shrink in attempts:
        if shrink:
            a, o, st, ok = _fit(est, aux0, occ0, aux_min, ooc, limit, occ_fixed=fixed_occ)
        else:
            a, o = aux0, occ0
            st = stage_estimates(**est, aux_block=a, occ_block=o, out_of_core=ooc)
            ok = max(st.values()) <= limit
        if ok:
            return ooc, a, o, st
    return None


def _too_small(est: dict, storage: str, aux_min: int, occ0: int, fixed_occ: bool, limit: float) -> MemoryLimitError:
    """The MemoryLimitError of ``plan_memory`` when even its smallest plan does not fit ``limit``:
    the minimum, where B would be and the smallest blocks, in human units."""
    need = _min_mb(est, aux_min, occ0 if fixed_occ else 1, storage)
    where = {"memory": "with B in memory (storage 'memory')", "disk": "with B on disk", "auto": "with B on disk"}[
        storage
    ]
    blocks = f"occupied block {occ0} (from the checkpoint)" if fixed_occ else "occupied block 1"
    nocc, nvir, naux = est["nocc"], est["nvir"], est["naux"]
    return MemoryLimitError(
        f"this run needs at least {human(need)} ({where}, auxiliary block {aux_min}, {blocks}) "
        f"but the memory limit is {human(limit)} (nocc {nocc}, nvir {nvir}, naux {naux}); "
        f"raise the memory limit or use a smaller basis",
        need_mb=need,
        limit_mb=limit,
    )


def _min_mb(shapes, aux_min, occ_min, storage) -> float:
    ooc = storage != "memory"
    return max(stage_estimates(**shapes, aux_block=aux_min, occ_block=occ_min, out_of_core=ooc).values())


class Buffers:
    """Scratch tensors reused across the blocks of a loop, by name: ``get(name, shape)`` is a
    contiguous tensor of that shape on the leading part of one allocation (its start, so aligned as
    a fresh tensor), grown when a block is larger. Why: a fresh temporary of a few hundred MB is
    handed back to the system when freed (above glibc's mmap threshold), so every block would pay
    its page faults again (scripts/results/docstring-measurements.md).
    A tensor from ``get`` is valid until the next ``get`` of its name."""

    def __init__(self, dtype=torch.float64, device="cpu"):
        self.dtype, self.device, self.store = dtype, device, {}

    def get(self, name: str, shape) -> torch.Tensor:
        n = math.prod(shape)
        t = self.store.get(name)
        if t is None or t.numel() < n:
            t = self.store[name] = torch.empty(n, dtype=self.dtype, device=self.device)
        return t[:n].view(*shape)
