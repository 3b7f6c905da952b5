"""A checkpoint over several ranks: one HDF5 file per rank, rank 0's the manifest.

    ck.h5          rank 0's file: the one-process layout (dfmp2.io.checkpoint) whose fingerprint also
                   holds 'ranks' (the world size) and 'rank' 0, in its crc32 with the rest. It holds
                   the SCF once (/scf, /mol): the orbitals every rank's MP2 stage reads are rank 0's
                   (jk_dist.same_orbitals with the split SCF; the same bits with the replicated one)
    ck.h5.rank<r>  rank r's file, the same fingerprint with its own 'rank'; /scf_shared (an empty
                   group) once rank 0's file holds the SCF, so the rank keeps its file on a failure

In every rank's file:

    /B             a group: one dataset per occupied block the rank owns (mp2.dist.owned), named by
                   the block's index, (naux, nk*nvir) in the pair step's dtype; attrs as the
                   one-process /B (complete, metric, metric_dropped, info_crc32)
    /B_crc         (blocks owned,) int64: crc32 of each block in index order, -1 before it is written
    /B_beta, /B_beta_crc    UHF: the beta channel's, likewise
    /pairs (UHF /pairs_aa, /pairs_bb, /pairs_ab)   sums, crc and done over every block pair in the
                   one-process order; done only for the pairs this rank computes (mp2.dist.assigned,
                   fixed by the rank count), so no file is 'complete' on its own (``partial_pairs``)

The integrity rules are the one-process file's: everything read back carries a crc32, checked when
the file is opened (B's blocks included, all read once), datasets allocated before they are
written, a pair's done flag written after its sums and crc, B's complete flag after every block
and crc. A resume on another rank count is refused in one line naming both (``checkpoint.
_check_ranks``): B and the pair sums are laid out by rank, and are not redistributed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dfmp2.io.checkpoint import Checkpoint, CheckpointError, _writes, block_crc

SCF_SHARED = "scf_shared"  # on ranks > 0: rank 0's file holds the SCF


def rank_path(path, rank: int) -> Path:
    """The file of ``rank`` for the checkpoint ``path``: ``path`` itself on rank 0 (the manifest),
    ``path.rank<r>`` beside it on rank r."""
    return Path(path) if rank == 0 else Path(f"{path}.rank{rank}")


class RankCheckpoint(Checkpoint):
    """One rank's file of a checkpoint over ranks (module docstring). ``create``/``resume`` as the
    one-process Checkpoint, with a fingerprint holding 'ranks' and 'rank'."""

    partial_pairs = True

    def __init__(self, path: Path, f, fp: dict):
        super().__init__(path, f, fp)
        self.rank = int(fp.get("rank", 0))

    # ---- the SCF: rank 0's file holds it, the others mark that it does
    @property
    def has_scf(self) -> bool:
        return ("scf" if self.rank == 0 else SCF_SHARED) in self.f

    @_writes
    def save_scf(self, ref, scf_mode: str, mol=None) -> None:
        """Rank 0 writes the SCF (the one-process way); the other ranks write nothing here
        (``share_scf`` marks their files once rank 0's holds it)."""
        if self.rank == 0:
            super().save_scf(ref, scf_mode, mol)

    @_writes
    def _mark_scf_shared(self) -> None:
        if SCF_SHARED not in self.f:
            self.f.create_group(SCF_SHARED)
            self.f.flush()

    def share_scf(self, world) -> None:
        """After ``save_scf`` on every rank: the ranks learn whether rank 0's file holds the SCF (one
        small all-reduce), and the others mark their files so (kept on a later failure)."""
        import torch

        flag = torch.tensor([1.0 if self.rank == 0 and self.has_scf else 0.0], dtype=torch.float64)
        if world.all_reduce_sum(flag, "scf").item() and self.rank:
            self._mark_scf_shared()

    def shared_reference(self, world):
        """The Reference of rank 0's file on every rank (read and crc-checked there, sent to the
        others bit for bit), or None on every rank when rank 0's file holds no SCF."""
        ref = self.load_scf() if self.rank == 0 and self.has_scf else None
        ref = world.gather_objects(ref, "scf")[0]
        if ref is not None and self.rank:
            self._mark_scf_shared()
        return ref

    # ---- B: this rank's own occupied blocks
    @_writes
    def save_own_b(self, own: dict, metric_kind: str, metric_info: dict, channel: int = 0) -> None:
        """Write this rank's blocks ``own`` ({k: (naux, nk*nvir) tensor}) of ``channel`` and mark them
        complete with their metric: allocated first, then each block and its crc32, then the flag."""
        import h5py

        name, f = self.b_names[channel], self.f
        for stale in (name, name + "_crc", name + "_tmp"):
            if stale in f:
                del f[stale]
        g = f.create_group(name + "_tmp")
        g.attrs["complete"] = 0
        ks = sorted(own)
        for k in ks:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # no metadata change at the write
            npdt = own[k].new_empty(0).cpu().numpy().dtype
            g.create_dataset(str(k), shape=tuple(own[k].shape), dtype=npdt, dcpl=dcpl, fill_time="never")
        crc = f.create_dataset(name + "_crc", data=np.full(len(ks), -1, dtype=np.int64))
        f.flush()
        f.move(name + "_tmp", name)
        f.flush()
        for n, k in enumerate(ks):
            arr = np.ascontiguousarray(own[k].detach().cpu().numpy())
            f[name][str(k)].write_direct(arr)
            crc[n] = block_crc(arr)
        f.flush()
        self.mark_b_complete(metric_kind, metric_info, channel)

    def load_own_b(self, blocks, ks, dtype, device, channel: int = 0) -> dict:
        """{k: block} for this rank's blocks ``ks`` of ``channel`` (checked against their crc32
        again), each its own torch allocation on ``device`` as a freshly fitted block is."""
        import torch

        name = self.b_names[channel]
        g, crc = self.f[name], self.f[name + "_crc"][...]
        if sorted(g, key=int) != [str(k) for k in ks]:
            raise CheckpointError(
                f"checkpoint {self.path} is corrupted: {name} holds blocks {sorted(g, key=int)}, this rank "
                f"owns {list(ks)}; remove the checkpoint files and run again"
            )
        out = {}
        for n, k in enumerate(ks):
            d = g[str(k)]
            if d.shape != tuple(blocks.shape(k)):
                raise CheckpointError(
                    f"checkpoint {self.path} is corrupted: block {k} of {name} has shape {d.shape}, "
                    f"expected {tuple(blocks.shape(k))}"
                )
            t = torch.empty(d.shape, dtype=dtype)  # torch's allocation (alignment), as a fitted block's
            d.read_direct(t.numpy())
            if block_crc(t.numpy()) != crc[n]:
                raise self._corrupted(f"block {k} of {name}")
            out[k] = t if t.device == torch.device(device) else t.to(device)
        return out

    def _verify(self) -> None:
        """The one-process checks, then every block of a complete B against its crc32 (all read
        once now, so a damaged block is refused before any rank starts work)."""
        super()._verify()
        for c, name in enumerate(self.b_names):
            if not self.b_done(c):
                continue
            g, crc = self.f[name], self.f[name + "_crc"][...]
            keys = sorted(g, key=int)
            if len(keys) != len(crc):
                raise CheckpointError(
                    f"checkpoint {self.path} is corrupted: {name} holds {len(keys)} blocks but "
                    f"{len(crc)} checksums; remove the checkpoint files and run again"
                )
            for n, k in enumerate(keys):
                if block_crc(g[k][...]) != crc[n]:
                    raise self._corrupted(f"block {k} of {name}")
