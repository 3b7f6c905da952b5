"""One rank's file of a checkpoint over ranks (dfmp2.io.rank_checkpoint), without any process group:
its own blocks of B and its pairs read back bit for bit, every dataset read back under a crc32
(a flipped byte refused in one line), another rank count refused naming both counts. The runs
over ranks (killed, resumed, refused) are in tests/system/test_distributed.py."""

import h5py
import numpy as np
import pytest
import torch

from dfmp2.df.outofcore import OccBlocks
from dfmp2.io.checkpoint import CheckpointError
from dfmp2.io.rank_checkpoint import RankCheckpoint, rank_path

BLOCKS = OccBlocks(nocc=6, nvir=3, naux=4, occ_block=2)  # 3 blocks of (4, 6), 6 block pairs
FP = {"geometry": [["H", 0.0, 0.0, 0.0]], "ranks": 2, "rank": 1}
OWN = [1, 2]  # rank 1 of 2 owns blocks 1 and 2 (mp2.dist.owned)
MINE = [1, 5]  # the block pairs it finished


def _own():
    g = torch.Generator().manual_seed(7)
    return {k: torch.randn(BLOCKS.shape(k), generator=g, dtype=torch.float64) for k in OWN}


@pytest.fixture
def rank_file(tmp_path):
    path = rank_path(tmp_path / "ck.h5", 1)
    ck = RankCheckpoint.create(path, FP, occ_block=2)
    ck.save_own_b(_own(), "cholesky", {})
    (done, _sums), on_pair = ck.pair_session(len(BLOCKS.pairs()))
    assert not done.any()
    for p in MINE:
        on_pair(p, -0.1 * p, -0.01 * p)
    ck.mark_complete(-1.0, -0.5)  # complete, with only this rank's pairs done: not refused
    ck.close()
    return path


def test_rank_file_reads_back_bit_for_bit(rank_file):
    assert rank_file.name == "ck.h5.rank1" and rank_path(rank_file.parent / "ck.h5", 0).name == "ck.h5"
    ck = RankCheckpoint.resume(rank_file, FP)
    try:
        assert ck.b_done() and not ck.has_scf and ck.metric() == ("cholesky", {})
        own = ck.load_own_b(BLOCKS, OWN, torch.float64, "cpu")
        want = _own()
        for k in OWN:
            assert torch.equal(own[k], want[k]) and own[k].is_contiguous()
        done, sums = ck.load_pairs()
        assert list(np.flatnonzero(done)) == MINE and sums[5].tolist() == [-0.5, -0.05]
        with pytest.raises(CheckpointError, match="holds blocks"):
            ck.load_own_b(BLOCKS, [0, 1], torch.float64, "cpu")  # another rank's blocks
    finally:
        ck.close()


@pytest.mark.parametrize("fp,says", [({**FP, "ranks": 3}, "3 ranks"), ({"geometry": FP["geometry"]}, "one process")])
def test_another_rank_count_is_refused_naming_both(rank_file, fp, says):
    with pytest.raises(CheckpointError, match=f"written by 2 ranks but this run has {says}; resume it on 2 ranks"):
        RankCheckpoint.resume(rank_file, fp)


def test_another_ranks_file_is_refused(rank_file):
    with pytest.raises(CheckpointError, match="rank is 1 in the checkpoint but 0 here"):
        RankCheckpoint.resume(rank_file, {**FP, "rank": 0})


@pytest.mark.parametrize("dataset", ["B/1", "B/2", "B_crc", "pairs/sums", "pairs/crc", "pairs/done"])
def test_a_flipped_byte_in_any_dataset_is_refused(rank_file, dataset):
    with h5py.File(rank_file, "r") as f:
        d = f[dataset]
        offset, nbytes = d.id.get_offset(), d.id.get_storage_size()
        at = 16 * MINE[0] + 3 if dataset == "pairs/sums" else 8 * MINE[0] if dataset == "pairs/crc" else nbytes // 2
        at = MINE[0] if dataset == "pairs/done" else at
    with open(rank_file, "r+b") as fh:
        fh.seek(offset + at)
        b = fh.read(1)
        fh.seek(offset + at)
        fh.write(bytes([b[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="is corrupted") as e:
        RankCheckpoint.resume(rank_file, FP)
    assert "\n" not in str(e.value) and "ck.h5.rank1" in str(e.value)
