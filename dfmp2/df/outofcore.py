"""B by occupied block, in memory or on disk (HDF5), and the column-blocked fit and block-streamed
pair step that use it. One code path for both places: only where a block lives differs.

Layout. (P|ia) and B are stored as one block per occupied block k (orbitals o0:o1, columns
c0:c1 = o0*nvir:o1*nvir of the pipeline's (naux, nocc*nvir) layout): block k is a row-major
(naux, (o1-o0)*nvir) array, the columns the fit solves together and the operand the pair kernel
reads for block k (``pair_view``). On disk the blocks lie back to back in one 1-D contiguous
HDF5 dataset, block k at element offset naux*c0, so

  * the integral loop writes rows p0:p1 of block k as one contiguous piece,
  * the fit reads and rewrites block k as one contiguous piece (in place when (P|ia) and B have
    the same dtype),
  * the pair step reads block I once per row of block pairs and block J once per pair, each one
    contiguous read: nblocks (nblocks + 1) / 2 block reads in all.

Why bitwise equal. Every block, in memory or read from disk, is its own torch allocation with
the same shape, strides and (torch's 64-byte) alignment, the fit solves the same columns
together, the pair kernel sees the same operands in the same order, and the pair sums are
combined in one fixed order (``combine``). MKL (torch's CPU BLAS) may take a different code
path for different shapes or alignments, and GEMMs of different shapes may sum in a different
order, so the in-memory path uses exactly this blocking too rather than one big trsm on a
strided B.

Overlap. A background thread reads ahead (``PREFETCH_DEPTH`` blocks in flight) and another
writes behind (``WRITE_DEPTH`` queued), both ``dfmp2.df.background.Background``. h5py 3.16 /
HDF5 2.0 releases the GIL inside H5Dread: a pure-Python loop in the main thread kept running
during large reads on another thread, stalled for the interpreter's switch interval at most, not
for the whole read (scripts/results/docstring-measurements.md).
h5py serialises HDF5 calls with its own lock, so the reader and writer threads take turns in
the library but the main thread's torch work runs meanwhile.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch

from dfmp2 import linalg, memory
from dfmp2.df.background import Background
from dfmp2.df.fitting import apply_metric
from dfmp2.io import tempdirs
from dfmp2.io.checkpoint import CheckpointError, discard_h5, open_h5
from dfmp2.io.outputs import check_disk, writing

H5_SUFFIX = ".h5"
SCRATCH = ("scratch file", "scratch_dir")  # HDF5B.where: what a file is, the option that placed it
CHECKPOINT = ("checkpoint", "checkpoint")


# ---------------------------------------------------------------- blocking
@dataclass(frozen=True)
class OccBlocks:
    """The occupied blocking shared by the fit and the pair step."""

    nocc: int
    nvir: int
    naux: int
    occ_block: int

    @property
    def count(self) -> int:
        return -(-self.nocc // self.occ_block)

    @property
    def size(self) -> int:
        """Elements of (P|ia) or B: naux * nocc * nvir."""
        return self.naux * self.nocc * self.nvir

    def orbitals(self, k: int) -> tuple[int, int]:
        o0 = k * self.occ_block
        return o0, min(self.nocc, o0 + self.occ_block)

    def columns(self, k: int) -> tuple[int, int]:
        o0, o1 = self.orbitals(k)
        return o0 * self.nvir, o1 * self.nvir

    def shape(self, k: int) -> tuple[int, int]:
        c0, c1 = self.columns(k)
        return self.naux, c1 - c0

    def span(self, k: int) -> tuple[int, int]:
        """Element range of block k in the flat block-major storage."""
        c0, c1 = self.columns(k)
        return self.naux * c0, self.naux * c1

    def pairs(self) -> list[tuple[int, int]]:
        """Block pairs (I, J), J <= I, row by row with the diagonal first (so block I, read
        first, serves as Bi for its whole row)."""
        return [(i, j) for i in range(self.count) for j in [i] + list(range(i))]


def pair_view(block: torch.Tensor, nvir: int) -> torch.Tensor:
    """(naux, n*nvir) block -> (n, nvir, naux) view, the operand of linalg.mp2_pair_energy."""
    naux, ncol = block.shape
    return block.view(naux, ncol // nvir, nvir).permute(1, 2, 0)


def combine(sums: np.ndarray, pairs) -> tuple[float, float]:
    """E_OS, E_SS from per-pair block sums (npairs, 2), in pair order; off-diagonal blocks count
    twice. The one place the block sums are added, so every path adds them in the same order."""
    e_os = e_ss = 0.0
    for (i, j), (os_, ss_) in zip(pairs, sums.tolist()):
        w = 1.0 if i == j else 2.0
        e_os += w * os_
        e_ss += w * ss_
    return e_os, e_ss


# ---------------------------------------------------------------- stores
class InMemoryB:
    """(P|ia) or B held as one device tensor per occupied block (each its own allocation)."""

    on_disk = False

    def __init__(self, blocks: OccBlocks, dtype: torch.dtype, device, *, allocate: bool = True):
        self.blocks, self.dtype, self.device = blocks, dtype, torch.device(device)
        self.data: list[torch.Tensor | None] = [
            torch.empty(blocks.shape(k), dtype=dtype, device=self.device) if allocate else None
            for k in range(blocks.count)
        ]

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        """Rows p0:p1 of (P|ia), rows (p1 - p0, nocc*nvir) on the device."""
        for k in range(self.blocks.count):
            c0, c1 = self.blocks.columns(k)
            cast(torch.Tensor, self.data[k])[p0:p1] = rows[:, c0:c1]  # allocated: the blocks are set

    def set_block(self, k: int, block: torch.Tensor) -> None:
        if block.dtype != self.dtype or not block.is_contiguous():
            raise ValueError(f"block {k}: expected a contiguous {self.dtype} tensor")
        self.data[k] = block

    def release(self, k: int) -> None:
        """Free block k (a (P|ia) block once the fit has read it)."""
        self.data[k] = None

    def iter_blocks(self, order, backend):
        """(k, block on the device) for k in order."""
        for k in order:
            yield k, self.data[k]

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.data = []


class HDF5B:
    """(P|ia) or B in one flat, contiguous HDF5 dataset, block-major (module docstring).

    Reads go through a prefetch thread, writes through a writer thread. ``evict=True`` drops each
    block from the OS page cache after reading it (posix_fadvise), so a benchmark on a machine
    whose RAM could cache the whole file still reads from the disk, as a B larger than RAM would.
    ``where``: (what the file is, the RunOptions field that placed it), for the one line a write
    the disk refuses becomes (``outputs.writing``): ('scratch file', 'scratch_dir') or
    ('checkpoint', 'checkpoint').
    """

    on_disk = True

    def __init__(self, dset, blocks: OccBlocks, *, crc=None, evict: bool = False, where: tuple[str, str] = SCRATCH):
        if dset.shape != (blocks.size,):
            raise ValueError(f"B dataset {dset.name} has shape {dset.shape}, expected ({blocks.size},)")
        self.dset, self.blocks = dset, blocks
        self.dtype = torch.from_numpy(np.empty(0, dtype=dset.dtype)).dtype
        self.crc = crc  # (nblocks,) int64 dataset: crc32 per block (checkpoints)
        self._verified: set[int] = set()
        self.evict, self.where = evict, where
        self._writer: Background | None = None  # write-behind thread, made at the first write
        self._fd: int | None = None

    @property
    def path(self) -> str:
        return self.dset.file.filename

    def _submit(self, fn, *args) -> None:
        """fn(*args) behind the caller: WRITE_DEPTH queued behind the one in flight."""
        if self._writer is None:
            self._writer = Background("dfmp2-writer", depth=memory.WRITE_DEPTH + 1)
        self._writer.put(fn, *args)

    def _writing(self):
        return writing(self.path, *self.where)

    def _write(self, a: int, arr: np.ndarray) -> None:
        with self._writing():
            self.dset.write_direct(arr, dest_sel=np.s_[a : a + arr.size])

    def write_rows(self, p0: int, p1: int, rows: torch.Tensor) -> None:
        """Rows p0:p1 of (P|ia): one contiguous piece per occupied block, written behind."""
        host = rows.detach().to("cpu", self.dtype).numpy()
        for k in range(self.blocks.count):
            c0, c1 = self.blocks.columns(k)
            piece = np.ascontiguousarray(host[:, c0:c1]).reshape(-1)
            a = self.blocks.span(k)[0] + p0 * (c1 - c0)
            self._submit(self._write, a, piece)

    def set_block(self, k: int, block: torch.Tensor) -> None:
        arr = block.detach().to("cpu", self.dtype).contiguous().numpy().reshape(-1)

        def job(a=self.blocks.span(k)[0], arr=arr):  # noqa: B008 (bound now: the job runs later, on the I/O thread)
            self._write(a, arr)
            if self.crc is not None:
                with self._writing():
                    self.crc[k] = zlib.crc32(memoryview(arr).cast("B"))
                self._verified.add(k)

        self._submit(job)

    def release(self, k: int) -> None:
        pass

    def read_block(self, k: int) -> torch.Tensor:
        """Block k as a fresh host tensor (naux, width); checked against its crc32 the first
        time it is read when the store has checksums."""
        a, b = self.blocks.span(k)
        out = torch.empty(self.blocks.shape(k), dtype=self.dtype)
        self.dset.read_direct(out.view(-1).numpy(), source_sel=np.s_[a:b])
        if self.crc is not None and k not in self._verified:
            want = int(self.crc[k])
            got = zlib.crc32(memoryview(out.view(-1).numpy()).cast("B"))  # type: ignore[arg-type]  # (io.checkpoint)
            if want != got:
                raise CheckpointError(
                    f"checkpoint {self.path} is corrupted: block {k} of B fails its "
                    "checksum; remove the file and run again"
                )
            self._verified.add(k)
        if self.evict:
            self._drop_cache(a, b)
        return out

    def verify(self) -> None:
        """Read every block not yet checked against its crc32 (CheckpointError on a mismatch):
        a resumed checkpoint is checked whole, also where no remaining pair reads a block."""
        if self.crc is not None:
            for k in range(self.blocks.count):
                if k not in self._verified:
                    self.read_block(k)

    def _drop_cache(self, a: int, b: int) -> None:
        base = self.dset.id.get_offset()
        if base is None or not hasattr(os, "posix_fadvise"):
            return
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDONLY)
        isz = self.dset.dtype.itemsize
        os.posix_fadvise(self._fd, base + a * isz, (b - a) * isz, os.POSIX_FADV_DONTNEED)

    def iter_blocks(self, order, backend):
        """(k, block on the backend's device) for k in order, read ahead on a background thread."""
        self.flush()
        order = list(order)
        reader = Background("dfmp2-prefetch", depth=memory.PREFETCH_DEPTH)
        with closing(reader.map(self.read_block, order)) as reads:
            for k, host in zip(order, reads):
                yield k, backend.to_device(host)

    def flush(self) -> None:
        """Wait for the queued writes and push them to the file."""
        if self._writer is not None:
            self._writer.wait()
        with self._writing():
            self.dset.file.flush()

    def close(self) -> None:
        """Stop the writer: writes not yet started are dropped (``flush`` first keeps them)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------- the store factory
def open_b_store(
    plan, blocks: OccBlocks, dtype: torch.dtype, backend, *, checkpoint=None, scratch=None, channel: int = 0
) -> BStore:
    """B (block k a (naux, nk*nvir) array in ``dtype``) wherever ``plan`` and ``checkpoint`` put it,
    behind one interface (the role of PySCF's ``_make_df_eris``): in memory on the backend's
    device (plan.out_of_core False), else HDF5 on disk: the checkpoint's /B (crc32 per block) or a
    file in a private directory under ``scratch`` (default: the system's temp dir), removed by
    ``close()``. A checkpoint that already holds a complete B gives a ``complete`` store: on disk
    every block is checked against its crc32 now, in memory every block as it is copied in; a
    damaged block is a CheckpointError. ``checkpoint``: a dfmp2.io.checkpoint.Checkpoint;
    ``channel``: the spin channel whose B this is (its dataset in the checkpoint)."""
    ck, tmp = checkpoint, Scratch(scratch)
    store = None
    done = ck is not None and ck.b_done(channel)
    try:
        if ck is not None and (plan.out_of_core or done):
            disk = HDF5B(ck.b_dataset(blocks, dtype, channel), blocks, crc=ck.crc_dataset(channel), where=CHECKPOINT)
        elif plan.out_of_core:
            disk = HDF5B(create_flat(tmp.open("B"), "B", blocks, dtype), blocks)
        if plan.out_of_core:
            store = BStore(disk, ck, tmp, channel)
            if done:
                disk.verify()  # all of B once, so any damaged block is refused
        else:
            store = BStore(InMemoryB(blocks, dtype, backend.device, allocate=False), ck, tmp, channel)
            if done:
                with closing(disk.iter_blocks(range(blocks.count), backend)) as it:
                    for k, blk in it:
                        store.data.set_block(k, blk.contiguous())
                disk.close()
        if done:
            store.complete, store.metric = True, ck.metric(channel)
        return store
    except BaseException:
        (store or tmp).close()
        raise


class BStore:
    """B for the DF-MP2 stage (``open_b_store``). Block access (blocks, dtype, on_disk, path,
    write_rows, set_block, read_block, iter_blocks, flush) is that of ``data``, an InMemoryB or
    HDF5B. ``complete``: B holds a finished B; ``metric`` is then the (kind, info) of its fit.
    ``channel``: the spin channel (the checkpoint's dataset for it)."""

    def __init__(self, data, checkpoint, scratch: Scratch, channel: int = 0):
        self.data, self.checkpoint, self.scratch, self.channel = data, checkpoint, scratch, channel
        self.complete = False
        self.metric: tuple[str, dict] | None = None

    def __getattr__(self, name):
        return getattr(self.data, name)

    def open_pia(self, dtype: torch.dtype):
        """A store for (P|ia) in ``dtype`` that ``fit_blocks`` turns into this B: in memory beside
        it; on disk, B's own dataset (fitted in place) when the dtypes match, else a scratch file
        (its disk freed by ``close_pia``)."""
        if not self.on_disk:
            return InMemoryB(self.blocks, dtype, self.device)
        if dtype == self.dtype:
            return HDF5B(self.data.dset, self.blocks, where=self.data.where)
        return HDF5B(create_flat(self.scratch.open("Pia"), "Pia", self.blocks, dtype), self.blocks)

    def close_pia(self, pia) -> None:
        pia.close()
        if pia.on_disk and pia.dset is not self.data.dset:
            self.scratch.remove(pia.dset.file)  # (P|ia) in fp64 next to an fp32 B: free its disk now

    def mark_complete(self, metric_kind: str, metric_info: dict) -> None:
        """B is built by a fit of ``metric_kind``: a checkpoint records it (B copied in when B is
        in memory, crc32 per block), so a resumed run reads it back."""
        ck = self.checkpoint
        if ck is not None:
            if not self.on_disk:
                disk = HDF5B(
                    ck.b_dataset(self.blocks, self.dtype, self.channel),
                    self.blocks,
                    crc=ck.crc_dataset(self.channel),
                    where=CHECKPOINT,
                )
                try:
                    for k in range(self.blocks.count):
                        disk.set_block(k, self.data.data[k])
                    disk.flush()
                finally:
                    disk.close()
            ck.mark_b_complete(metric_kind, metric_info, self.channel)
        self.complete, self.metric = True, (metric_kind, metric_info)

    def close(self) -> None:
        try:
            self.data.close()
        finally:
            self.scratch.close()


# ---------------------------------------------------------------- scratch files
class Scratch:
    """A private scratch directory for one run's out-of-core files, removed on close whatever
    happened (success, error, Ctrl-C or SIGTERM turned into KeyboardInterrupt by the CLI)."""

    def __init__(self, parent: str | os.PathLike | None = None):
        self.parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
        self.path: Path | None = None
        self._files: list = []

    def check_space(self, need_mb: float) -> None:
        """InputError before any heavy work when the scratch disk is too small (outputs.check_disk)."""
        check_disk([(self.parent, need_mb, "scratch_dir")])

    def open(self, name: str):
        """A new HDF5 file in the scratch directory (created on first use)."""
        if self.path is None:
            self.path = Path(tempfile.mkdtemp(prefix="dfmp2-", dir=self.parent))
            tempdirs.register(self.path)
        path = self.path / f"{name}{H5_SUFFIX}"
        with writing(path, *SCRATCH):
            f = open_h5(path, "w")
        self._files.append((f, path))
        return f

    def remove(self, h5file) -> None:
        """Close and delete one of this scratch directory's files now."""
        self._files = [(f, p) for f, p in self._files if f is not h5file]
        discard_h5(h5file, h5file.filename)

    def close(self) -> None:
        for f, path in self._files:  # closed writing nothing more: no failed close on a full disk
            discard_h5(f, path)
        self._files = []
        if self.path is not None:
            shutil.rmtree(self.path, ignore_errors=True)
            tempdirs.unregister(self.path)
            self.path = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def create_flat(h5file, name: str, blocks: OccBlocks, dtype: torch.dtype):
    """A contiguous 1-D dataset for (P|ia) or B (no fill: every element is written before read)."""
    npdt = torch.empty(0, dtype=dtype).numpy().dtype
    if name in h5file:
        del h5file[name]
    return h5file.create_dataset(name, shape=(blocks.size,), dtype=npdt, fill_time="never")


# ---------------------------------------------------------------- the two heavy loops
def fit_blocks(M: torch.Tensor, kind: str, src, dst, backend, out_dtype: torch.dtype) -> None:
    """B_k = L^-1 (P|ia)_k (kind 'cholesky', M = L lower) or M (P|ia)_k (kind 'eigh', M = j2c^-1/2,
    symmetric), one occupied block of columns at a time, cast to ``out_dtype`` and stored in
    ``dst`` (which may be ``src``: each block is replaced after it is read). M: on the device in
    the fit dtype (naux, naux)."""
    with closing(src.iter_blocks(range(src.blocks.count), backend)) as it:
        for k, cols in it:
            src.release(k)
            cols = cols.contiguous()
            blk = apply_metric(M, kind, cols, backend)
            del cols
            dst.set_block(k, blk.to(out_dtype).contiguous())
    dst.flush()


def _resumed_sums(total: int, done, progress) -> tuple:
    """The start of a pair loop that may resume: (sums (total, 2) fp64 with the finished pairs'
    rows from ``done`` = (finished (total,) bool, their sums), the pair indices left in order, how
    many are finished); ``progress(finished, total)`` when some are."""
    sums = np.zeros((total, 2), dtype=np.float64)
    finished = np.zeros(total, dtype=bool)
    if done is not None:
        finished[:] = done[0]
        sums[finished] = done[1][finished]
    todo = [p for p in range(total) if not finished[p]]
    ndone = total - len(todo)
    if progress is not None and ndone:
        progress(ndone, total)
    return sums, todo, ndone


def pair_block_sums(store, eps_occ, eps_vir, backend, *, done=None, on_pair=None, progress=None) -> np.ndarray:
    """(e_os, e_ss) of every block pair (``OccBlocks.pairs`` order), shape (npairs, 2), fp64.

    store: InMemoryB or HDF5B holding B. eps_*: fp64 orbital energies (Hartree) on the device.
    done: (npairs,) bool and ``sums`` of pairs already finished (from a checkpoint) as a tuple
    (done, sums); those are not recomputed and their blocks not read. on_pair(p, e_os, e_ss) after
    each computed pair (a checkpoint writes it); progress(done, total) after each pair.
    """
    blocks = store.blocks
    pairs = blocks.pairs()
    npairs = len(pairs)
    sums, todo, ndone = _resumed_sums(npairs, done, progress)
    # the blocks each remaining pair needs, in order: block I once per row, then each J != I
    reads, rows = [], {}
    for p in todo:
        i, j = pairs[p]
        if i not in rows:
            rows[i] = True
            reads.append(i)
        if j != i:
            reads.append(j)
    with closing(store.iter_blocks(reads, backend)) as it:
        nvir = blocks.nvir
        cur_i, Bi = None, None
        for p in todo:
            i, j = pairs[p]
            if i != cur_i:
                k, blk = next(it)
                assert k == i
                cur_i, Bi = i, pair_view(blk, nvir)
            if j == i:
                Bj = Bi
            else:
                k, blk = next(it)
                assert k == j
                Bj = pair_view(blk, nvir)
            (i0, i1), (j0, j1) = blocks.orbitals(i), blocks.orbitals(j)
            os_, ss_ = linalg.mp2_pair_energy(
                Bi, Bj, eps_occ[i0:i1], eps_occ[j0:j1], eps_vir, symmetric=(i == j), backend=backend
            )
            sums[p] = (os_, ss_)
            ndone += 1
            if on_pair is not None:
                on_pair(p, os_, ss_)
            if progress is not None:
                progress(ndone, npairs)
    return sums


def cross_block_sums(  # noqa: PLR0913
    store_a, store_b, eps_occ_a, eps_vir_a, eps_occ_b, eps_vir_b, backend, *, done=None, on_pair=None, progress=None
) -> np.ndarray:
    """UMP2's opposite-spin sums: (na * nb, 2) fp64, one row per block pair (I of ``store_a``, J of
    ``store_b``), I-major: the kernel's (e_os, e_ss); the plain sum of column 0 in this order is E_OS
    (no i >= j symmetry between spins; column 1, the same-spin form of a rectangular K, is unused).

    store_a, store_b: InMemoryB or HDF5B holding B^alpha and B^beta over the same naux (different
    nocc and nvir). eps_*: fp64 orbital energies (Hartree) on the device. Each alpha block with a
    pair left is read once, the beta blocks once per pair left. ``done``, ``on_pair``, ``progress``
    as ``pair_block_sums`` (a checkpoint's finished pairs are not recomputed).
    """
    ba, bb = store_a.blocks, store_b.blocks
    total = ba.count * bb.count
    sums, todo, ndone = _resumed_sums(total, done, progress)
    rows = sorted({p // bb.count for p in todo})
    with (
        closing(store_a.iter_blocks(rows, backend)) as it_a,
        closing(store_b.iter_blocks([p % bb.count for p in todo], backend)) as it_b,
    ):
        cur_i, Bi = None, None
        for p in todo:
            i = p // bb.count
            if i != cur_i:
                k, blk_a = next(it_a)
                assert k == i
                cur_i, Bi = i, pair_view(blk_a, ba.nvir)
            j, blk_b = next(it_b)
            (i0, i1), (j0, j1) = ba.orbitals(i), bb.orbitals(j)
            os_, ss_ = linalg.mp2_pair_energy(
                Bi,
                pair_view(blk_b, bb.nvir),
                eps_occ_a[i0:i1],
                eps_occ_b[j0:j1],
                eps_vir_a,
                eps_vir_j=eps_vir_b,
                backend=backend,
            )
            sums[p] = (os_, ss_)
            ndone += 1
            if on_pair is not None:
                on_pair(p, os_, ss_)
            if progress is not None:
                progress(ndone, total)
    return sums
