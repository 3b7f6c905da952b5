"""Runs over several processes (dfmp2.distributed), on CPU with gloo.

The energies over 2 and 3 ranks (3: the occupied blocks divide unevenly) must be bitwise those of
one process on the same device, precision, blocking and thread count: the single-process path is
checked against PySCF elsewhere (test_pipeline, test_ump2). The failure tests start the ranks as
a Slurm or MPI launcher would (RANK, WORLD_SIZE, ... set by hand), so each rank's exit status and
stderr are seen, and nothing (no torchrun agent) ends the survivors for them.
"""

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from json_schema import read as read_checked
from ranks import LIMIT_S
from ranks import env as _env
from ranks import error_lines as _error_lines
from ranks import launch as _launch
from ranks import torchrun as _torchrun

ROOT = Path(__file__).resolve().parents[2]
WATER = "3\nwater\nO 0.000 0.000 0.117\nH 0.000 0.757 -0.467\nH 0.000 -0.757 -0.467\n"
OH = "2\nhydroxyl radical\nO 0.0 0.0 0.0\nH 0.0 0.0 0.97\n"
NH2 = "3\namidogen charge=0 multiplicity=2\nN 0.0 0.0 0.0\nH 0.0 0.802 0.6367\nH 0.0 -0.802 0.6367\n"
# several occupied blocks (water: 5 occupied -> 3 blocks; OH: alpha 3, beta 2 blocks)
ARGS = ["--basis", "cc-pvdz", "--occ-block-max", "2", "--cpu-blas", "torch", "-q"]


def _run(tmp_path, ranks: int, xyz: str, name: str, scf_mode: str | None = None):
    """The result JSON of a run on ``ranks`` ranks (1: a plain process; more: torchrun) with the
    default options (``scf_mode`` None: the DF-SCF split over the ranks) or --dist-scf ``scf_mode``."""
    mol = tmp_path / f"{name}.xyz"
    mol.write_text(xyz)
    out = tmp_path / f"{name}-{ranks}-{scf_mode}.json"
    cmd = [sys.executable, "-m", "dfmp2", "run", str(mol), *ARGS, "--json", str(out)]
    if scf_mode is not None:
        cmd += ["--dist-scf", scf_mode]
    if ranks > 1:
        cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dfmp2"]
        cmd.append("-v")  # each rank's line of the memory plan
    p = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("E(HF)") == 1, p.stdout  # rank 0 alone prints
    err = " ".join(p.stderr.split())
    for r in range(ranks if ranks > 1 else 0):
        assert f"rank {r} of {ranks} (cpu): occupied blocks" in err, err[-2000:]
    return read_checked(out)  # the result JSON validated against the shipped schema (ran.distributed too)


# Default options (the split SCF) and the replicated SCF: E(HF), E_OS, E_SS bit for bit one process's
# at any rank count (equal threads per process, the same BLAS). The default channel runs water on 3
# ranks and OH on 2 (about a minute); the slow channel 2, 3 and 4 ranks of each, both SCF modes,
# and (H2O)4 on 2, 3 and 4.
RUNS = {"water": [(3, None)], "oh": [(2, None)]}
ALL_RUNS = [(n, None) for n in (2, 3, 4)] + [(n, "replicated") for n in (2, 3)]


@pytest.mark.heavy
@pytest.mark.parametrize("xyz,name", [(WATER, "water"), (OH, "oh")], ids=["water", "oh"])
def test_energies_over_ranks(tmp_path, xyz, name):
    _check_runs(tmp_path, xyz, name, RUNS[name])


@pytest.mark.slow
@pytest.mark.parametrize("xyz,name", [(WATER, "water"), (OH, "oh")], ids=["water", "oh"])
def test_energies_over_ranks_every_combination(tmp_path, xyz, name):
    _check_runs(tmp_path, xyz, name, ALL_RUNS)


@pytest.mark.slow
def test_water_tetramer_bitwise_over_ranks(tmp_path):
    """(H2O)4 / cc-pVDZ (cc-pVDZ-JKFIT: 16 groups of the JK factor) on 1, 2, 3 and 4 ranks."""
    xyz = (ROOT / "inputs" / "water_clusters" / "h2o_04.xyz").read_text()
    _check_runs(tmp_path, xyz, "h2o4", [(n, None) for n in (2, 3, 4)], check_b=False)


def _check_runs(tmp_path, xyz, name, runs, check_b=True):
    one = _run(tmp_path, 1, xyz, name)
    assert "distributed" not in one["ran"]
    for ranks, scf_mode in runs:
        res = _run(tmp_path, ranks, xyz, name, scf_mode)
        keys = [("energies", "e_hf"), ("energies", "e_corr_os"), ("energies", "e_corr_ss")]
        keys += [("spin", k) for k in ("e_corr_aa", "e_corr_bb", "e_corr_ab")] if one.get("spin") else []
        for part, k in keys:
            assert res[part][k] == one[part][k], (ranks, scf_mode, k, res[part][k], one[part][k])
        d = res["ran"]["distributed"]
        assert d["scf"] == (scf_mode or "split")
        if d["scf"] == "split":  # the JK factor split by auxiliary index
            assert res["ran"]["scf"]["jk_factor"]["naux"] < res["memory"]["shapes"]["naux_jk"]
            assert d["comm_bytes_all_ranks"]["scf"] > 0
        assert d["world_size"] == ranks and d["backend"] == "gloo" and len(d["devices"]) == ranks
        if check_b:
            _check_b_shares(one, d, ranks)


def _check_b_shares(one, d, ranks):
    """Per-rank B sums to the one-process B (within one block): every channel's naux*nocc*nvir*8."""
    chans = (
        [(one["spin"]["nocc_alpha"], one["spin"]["nvir_alpha"]), (one["spin"]["nocc_beta"], one["spin"]["nvir_beta"])]
        if one.get("spin")
        else [(one["shapes"]["nocc"], one["shapes"]["nvir"])]
    )
    naux = one["shapes"]["naux"]
    full = sum(naux * o * v * 8 for o, v in chans)
    block = naux * 2 * max(v for _, v in chans) * 8
    assert len(d["B_bytes_per_rank"]) == ranks and abs(sum(d["B_bytes_per_rank"]) - full) <= block
    assert max(d["B_bytes_per_rank"]) < full  # nobody holds all of B
    assert d["comm_bytes_all_ranks"]["transform"] > 0 and d["comm_bytes_all_ranks"]["pair"] > 0


@pytest.mark.heavy
def test_bad_input_on_one_rank_every_rank_exits_2(tmp_path):
    (tmp_path / "water.xyz").write_text(WATER)
    good = [str(tmp_path / "water.xyz"), *ARGS]
    bad = [str(tmp_path / "missing.xyz"), *ARGS]
    res = _launch(tmp_path, [good, bad])
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "missing.xyz" in lines[0], res
    assert not any("Traceback" in err for _, err, _ in res)


@pytest.mark.heavy
def test_bad_input_on_every_rank_one_error_line(tmp_path):
    (tmp_path / "water.xyz").write_text(WATER)
    res = _launch(tmp_path, [[str(tmp_path / "water.xyz"), "--basis", "no-such-basis", "-q"]] * 2)
    assert [rc for rc, _, _ in res] == [2, 2], res
    assert len(_error_lines(res)) == 1, res


def test_rank_killed_mid_pair_step(tmp_path):
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *ARGS]
    res = _launch(tmp_path, [args, args], DFMP2_TEST_FAULT="pair:1:kill")
    (rc0, err0, t0), (rc1, _, _) = res
    assert rc1 == -9 and rc0 != 0 and t0 < 60, res
    lines = _error_lines(res)
    assert len(lines) == 1 and "rank 0 of 2: lost contact" in lines[0] and "pair" in lines[0], res
    assert "Traceback" not in err0
    assert not list((tmp_path / "tmp").iterdir())  # no stray scratch files


# ---- checkpoints over ranks: one file per rank beside the manifest (dfmp2.io.rank_checkpoint)
CK_ARGS = [*ARGS, "--dist-scf", "replicated"]  # the orbitals bit for bit whatever the SCF's reduction order


@pytest.fixture(scope="module")
def killed_checkpoint(tmp_path_factory):
    """A 2-rank checkpointed run of water (3 occupied blocks, 6 block pairs) whose rank 1 is killed
    (SIGKILL) at its third pair: its files (ck.h5, ck.h5.rank1) in a directory of their own."""
    d = tmp_path_factory.mktemp("killed")
    (d / "water.xyz").write_text(WATER)
    args = [str(d / "water.xyz"), *CK_ARGS, "--checkpoint", str(d / "ck.h5")]
    res = _launch(d, [args, args], DFMP2_TEST_FAULT="pair:1:kill:2")
    (rc0, err0, _), (rc1, _, _) = res
    assert rc1 == -9 and rc0 == 2 and "Traceback" not in err0, res
    lines = _error_lines(res)
    assert len(lines) == 1 and "rank 0 of 2: lost contact" in lines[0], res
    assert sorted(p.name for p in d.glob("ck.h5*")) == ["ck.h5", "ck.h5.rank1"]  # kept to resume
    return d


def _flip_byte(path, dataset):
    """Invert one byte of ``dataset``'s data in the HDF5 file ``path``, behind HDF5's back: in the
    middle, or for the pair sums in the first finished pair's row (the others are not read back)."""
    import h5py

    with h5py.File(path, "r") as f:
        offset, nbytes = f[dataset].id.get_offset(), f[dataset].id.get_storage_size()
        at = nbytes // 2
        if dataset.endswith("sums"):
            at = 16 * int(f[dataset.replace("sums", "done")][...].nonzero()[0][0]) + 3
    with open(path, "r+b") as fh:
        fh.seek(offset + at)
        b = fh.read(1)
        fh.seek(offset + at)
        fh.write(bytes([b[0] ^ 0xFF]))


def _datasets(path) -> dict:
    """{name: bytes} of every dataset in the HDF5 file ``path`` (what a refused resume must leave)."""
    import h5py
    import numpy as np

    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.update({n: np.asarray(o[()]).tobytes()}) if isinstance(o, h5py.Dataset) else None)
    return out


def _copy_checkpoint(src: Path, dst: Path) -> Path:
    import shutil

    for p in src.glob("ck.h5*"):
        shutil.copy(p, dst / p.name)
    (dst / "water.xyz").write_text(WATER)
    return dst / "ck.h5"


@pytest.mark.heavy
def test_checkpoint_over_ranks_killed_in_the_pair_step_resumes_to_the_same_bits(tmp_path, killed_checkpoint):
    """Resumed on 2 ranks: E_OS/E_SS bit for bit those of an uninterrupted 2-rank run, the SCF, B and
    the pairs finished before the kill (on both ranks) taken from the files, not recomputed."""
    import h5py

    ck = _copy_checkpoint(killed_checkpoint, tmp_path)
    finished = 0
    for name in ("ck.h5", "ck.h5.rank1"):
        with h5py.File(tmp_path / name, "r") as f:
            finished += int(f["pairs/done"][...].sum())
            assert f["B"].attrs["complete"] == 1 and ("scf" in f) == (name == "ck.h5")
    assert 3 <= finished < 6  # rank 1's two before the kill, rank 0's before it noticed
    mol = str(tmp_path / "water.xyz")
    out = {k: tmp_path / f"{k}.json" for k in ("resumed", "whole")}
    res = _launch(tmp_path, [[mol, *CK_ARGS, "--resume", str(ck), "--json", str(out["resumed"])]] * 2)
    assert [rc for rc, _, _ in res] == [0, 0], res
    res = _launch(tmp_path, [[mol, *CK_ARGS, "--json", str(out["whole"])]] * 2)
    assert [rc for rc, _, _ in res] == [0, 0], res
    resumed, whole = (read_checked(out[k]) for k in ("resumed", "whole"))
    for k in ("e_hf", "e_corr_os", "e_corr_ss"):
        assert resumed["energies"][k] == whole["energies"][k], (k, resumed["energies"][k], whole["energies"][k])
    used = resumed["ran"]["storage"]["from_checkpoint"]
    assert used == {"scf": True, "B": True, "pairs": finished}, used
    assert resumed["ran"]["distributed"]["world_size"] == 2
    with h5py.File(ck, "r") as f:
        assert f.attrs["complete"] == 1 and f.attrs["e_os"] == resumed["energies"]["e_corr_os"]


@pytest.mark.heavy
def test_checkpoint_over_ranks_resumed_on_three_ranks_is_refused(tmp_path, killed_checkpoint):
    """Another rank count: refused in one line naming both counts, exit 2 on every rank promptly
    (45 s: three processes importing torch and PySCF on two cores, a loaded machine included),
    the files left as they were."""
    ck = _copy_checkpoint(killed_checkpoint, tmp_path)
    before = {p.name: _datasets(p) for p in tmp_path.glob("ck.h5*")}
    args = [str(tmp_path / "water.xyz"), *CK_ARGS, "--resume", str(ck), "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args] * 3)
    assert [rc for rc, _, _ in res] == [2, 2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "written by 2 ranks but this run has 3 ranks" in lines[0], res
    assert max(t for _, _, t in res) < 45 and not any("Traceback" in err for _, err, _ in res)
    assert {p.name: _datasets(p) for p in tmp_path.glob("ck.h5*")} == before  # (HDF5 clears its open flag)
    assert not (tmp_path / "out.json").exists()


@pytest.mark.heavy
@pytest.mark.parametrize("dataset", ["B/1", "pairs/sums"])
def test_checkpoint_over_ranks_with_a_corrupted_rank_file_is_refused(tmp_path, killed_checkpoint, dataset):
    """A byte flipped in rank 1's file (a block of its B, its finished pairs' sums): one error line,
    exit 2 on every rank, before any work."""
    ck = _copy_checkpoint(killed_checkpoint, tmp_path)
    _flip_byte(tmp_path / "ck.h5.rank1", dataset)
    args = [str(tmp_path / "water.xyz"), *CK_ARGS, "--resume", str(ck)]
    res = _launch(tmp_path, [args] * 2)
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "ck.h5.rank1 is corrupted" in lines[0] and "checksum" in lines[0], res
    assert max(t for _, _, t in res) < 30 and not any("Traceback" in err for _, err, _ in res)


@pytest.mark.heavy
def test_checkpoint_over_ranks_removed_after_a_failure_in_the_scf(tmp_path):
    """A rank that fails before the SCF is saved (the split SCF: the others stop at its first sum):
    nothing worth resuming, so no rank's file is left."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--checkpoint", str(tmp_path / "ck.h5")]
    res = _launch(tmp_path, [args, args], DFMP2_TEST_FAULT="scf:1:refuse")
    assert [rc for rc, _, _ in res] != [0, 0], res
    assert not list(tmp_path.glob("ck.h5*")), res


def test_single_process_has_no_group(monkeypatch):
    from dfmp2 import distributed

    for var in ("RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    w = distributed.join("cpu")
    assert not w.distributed and w.comm_backend is None and w.size == 1
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    assert not distributed.join("cpu").distributed


def test_rank_devices():
    from dfmp2 import distributed
    from dfmp2.errors import InputError

    assert distributed.rank_device("cpu", 3) == ("cpu", "gloo")
    assert distributed.rank_device("cuda", 3) == ("cuda:3", "nccl")
    with pytest.raises(InputError, match="index"):
        distributed.rank_device("cuda:1", 0)
    with pytest.raises(InputError, match="several processes"):
        distributed.rank_device("trn1", 0)


def test_work_is_shared_out():
    from dfmp2 import distributed
    from dfmp2.df.outofcore import OccBlocks
    from dfmp2.mp2 import dist

    for size in (1, 2, 3, 5):
        for count in (1, 3, 7, 10):
            worlds = [distributed.World(rank=r, size=size) for r in range(size)]
            owned = [list(dist.owned(count, w)) for w in worlds]
            assert sorted(k for o in owned for k in o) == list(range(count))
            assert max(map(len, owned)) - min(map(len, owned)) <= 1
            blocks = OccBlocks(2 * count, 3, 4, 2)
            who = dist.assigned(blocks, size)
            assert sorted(who) == sorted(blocks.pairs())
            owner = {k: r for r, o in enumerate(owned) for k in o}
            for (i, j), r in who.items():  # the rank holds both blocks at a shift s <= N/2
                shifts = [(r - owner[k]) % size for k in (i, j)]
                assert owner[i] == r or owner[j] == r
                assert all(2 * s <= size for s in shifts), ((i, j), r, shifts)
    # (H2O)16: 80 occupied in 5 blocks of 16 over 2 ranks (2 and 3 blocks): the shared shift evens it out
    blocks = OccBlocks(80, 304, 1344, 16)
    who = dist.assigned(blocks, 2)
    load = [sum(dist.pair_cost(blocks, *p) for p, r in who.items() if r == rank) for rank in (0, 1)]
    assert max(load) / min(load) < 1.1, load


def test_memory_plan_per_rank():
    """B's share per rank shrinks with the ranks; a run that does not fit says on how many it would."""
    from dfmp2 import distributed, memory
    from dfmp2.errors import MemoryLimitError
    from dfmp2.mp2 import dist

    shapes = dict(nao=400, nocc=64, nvir=336, naux=1500, itemsize=8, fit_itemsize=8)

    def plan():
        return memory.plan_memory(**shapes, limit_mb=distributed.UNLIMITED_MB, storage="memory")

    b_mb = plan().b_mb
    peaks = [max(dist.rank_stages_mb(plan(), n).values()) for n in (1, 2, 4)]
    assert peaks[0] > peaks[1] > peaks[2] and peaks[0] - peaks[2] > 0.5 * b_mb
    p = plan()
    dist.per_rank_plan(p, distributed.World(rank=0, size=4), limit_mb=peaks[2] + 1)
    assert p.peak_mb == pytest.approx(peaks[2]) and p.shapes["ranks"] == 4
    with pytest.raises(MemoryLimitError, match=r"per rank on 2 ranks .* it would fit on (\d+) ranks") as e:
        dist.per_rank_plan(plan(), distributed.World(rank=0, size=2), limit_mb=peaks[2] + 1)
    assert "e+" not in str(e.value)  # human units ('5.942e+04 MB')
    big = dict(shapes, nocc=640, nvir=3360, naux=15000)  # B 258 GB: the need in GB, not '2.58e+05 MB'
    with pytest.raises(MemoryLimitError, match=r"needs [\d.]+ GB per rank on 2 ranks .* limit is 10 GB per rank"):
        dist.per_rank_plan(
            memory.plan_memory(**big, limit_mb=distributed.UNLIMITED_MB, storage="memory"),
            distributed.World(rank=0, size=2),
            limit_mb=1e4,
        )
    n = int(e.value.args[0].rsplit("fit on ", 1)[1].split()[0])
    assert 2 < n <= 4 and max(dist.rank_stages_mb(plan(), n).values()) <= peaks[2] + 1


@pytest.mark.slow
def test_silent_rank_ends_the_others_by_the_timeout(tmp_path):
    """A rank alive but silent (hung) in the pair step: the others stop at the collective timeout."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *ARGS]
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "dfmp2", "run", *args],
            cwd=tmp_path,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_env(
                tmp_path,
                RANK=str(r),
                WORLD_SIZE="2",
                LOCAL_RANK=str(r),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
                DFMP2_DIST_TIMEOUT_S="8",
                DFMP2_TEST_FAULT="pair:1:hang",
            ),
        )
        for r in range(2)
    ]
    try:
        _, err = procs[0].communicate(timeout=LIMIT_S)
        assert procs[0].returncode == 2 and "did not answer within 8 s" in err, err
        assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1
    finally:
        procs[1].kill()
        procs[1].communicate()


@pytest.mark.heavy
def test_usage_error_printed_by_rank_0_only(tmp_path):
    """A usage error (click's, before the ranks could agree): every rank exits 2, rank 0 says why."""
    res = _launch(tmp_path, [["no.xyz", "--no-such-option"]] * 2)
    assert [rc for rc, _, _ in res] == [2, 2], res
    assert len(_error_lines(res)) == 1 and "--no-such-option" in _error_lines(res)[0]


def _frequencies(tmp_path, ranks: int, *extra) -> dict:
    """``dfmp2 frequencies`` of water (STO-3G: 19 small evaluations) on ``ranks`` ranks, its JSON."""
    (tmp_path / "water.xyz").write_text(WATER)
    out = tmp_path / f"freq-{ranks}.json"
    cmd = [sys.executable, "-m", "dfmp2", "frequencies", str(tmp_path / "water.xyz"), "--basis", "sto-3g"]
    cmd += ["--cpu-blas", "torch", "-q", "--json", str(out), *extra]
    if ranks > 1:
        cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dfmp2"]
    p = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("harmonic frequencies") == 1, p.stdout  # rank 0 alone prints
    return json.loads(out.read_text())


@pytest.mark.heavy
@pytest.mark.parametrize("ranks", [3, pytest.param(2, marks=pytest.mark.slow)])
def test_frequencies_over_ranks_are_one_process_s(tmp_path, ranks):
    """The evaluations dealt over 3 ranks (19 of them: the last round uneven) give the one-process
    Hessian and frequencies bit for bit (each evaluation is a one-process run at the same threads)."""
    one = _frequencies(tmp_path, 1)
    many = _frequencies(tmp_path, ranks)
    assert many["finite_differences"]["ranks"] == ranks and one["finite_differences"]["ranks"] == 1
    assert many["hessian"] == one["hessian"] and many["frequencies"] == one["frequencies"]
    assert many["thermo"] == one["thermo"]


@pytest.mark.heavy
def test_frequencies_in_groups_of_two_ranks_are_one_process_s(tmp_path):
    """4 ranks, --ranks-per-run 2: each evaluation a gradient over a group of 2 ranks (2 groups, 10
    rounds), bit for bit one process's Hessian and frequencies (the gradient over ranks is)."""
    one = _frequencies(tmp_path, 1)
    four = _frequencies(tmp_path, 4, "--ranks-per-run", "2")
    assert four["finite_differences"]["ranks"] == 4 and four["finite_differences"]["ranks_per_evaluation"] == 2
    assert four["hessian"] == one["hessian"] and four["frequencies"] == one["frequencies"]


@pytest.mark.heavy
def test_frequencies_bad_checkpoint_on_rank_0_ends_every_rank(tmp_path):
    """Rank 0 alone reads the checkpoint; its refusal ends both ranks at once: exit 2, one line."""
    (tmp_path / "water.xyz").write_text(WATER)
    (tmp_path / "ck.json").write_text("{not a checkpoint")
    args = [str(tmp_path / "water.xyz"), "--basis", "sto-3g", "-q", "--checkpoint", str(tmp_path / "ck.json")]
    res = _launch(tmp_path, [args, args], command="frequencies")
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "not a dfmp2 frequency checkpoint" in lines[0], res
    assert max(t for _, _, t in res) < 60


# ---- task-parallel commands: whole runs dealt to the ranks ---------------------------
DIMER = ROOT / "inputs" / "s22" / "s22_02_water_dimer.xyz"


@pytest.mark.heavy
def test_interaction_over_three_ranks_equals_one_process(tmp_path):
    """`torchrun --nproc-per-node 3 -m dfmp2 interaction` on the S22 water dimer: the 5 runs dealt
    to the ranks (2, 2, 1), each a one-process run, so every energy equals one process's bit for
    bit (equal threads per process); rank 0 alone prints and writes."""
    args = [str(DIMER), "--fragments", "1-3,4-6", "--basis", "sto-3g", "--cpu-blas", "torch"]
    outs = {}
    for ranks in (1, 3):
        out = tmp_path / f"ie-{ranks}.json"
        p, _ = _torchrun(tmp_path, ranks, [*args, "--json", str(out)], "interaction")
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.count("CP-corrected") == 1, p.stdout  # one table
        outs[ranks] = json.loads(out.read_text())
    one, three = outs[1], outs[3]
    assert [r["result"]["energies"] for r in three["runs"]] == [r["result"]["energies"] for r in one["runs"]]
    assert three["interaction_energies"] == one["interaction_energies"]
    assert three["ran"]["ranks"] == {"world_size": 3, "runs_per_rank": [2, 2, 1]} and "ranks" not in one["ran"]


@pytest.mark.heavy
@pytest.mark.parametrize("how", ["refuse", "kill"])
def test_a_failing_run_ends_every_rank(tmp_path, how):
    """A run that fails on one rank (the test hook: an InputError there, or the process killed)
    ends every rank promptly: the refusal with one error line from that rank and exit 2 on all;
    a killed rank with one error line from the survivor naming the lost rank."""
    args = [str(DIMER), "--fragments", "1-3,4-6", "--basis", "sto-3g", "-q"]
    out = _launch(tmp_path, [args, args], command="interaction", DFMP2_TEST_FAULT=f"task:1:{how}")
    codes = [rc for rc, _, _ in out]
    errors = [ln for _, err, _ in out for ln in err.splitlines() if ln.startswith("error:")]
    assert all(seconds < LIMIT_S for _, _, seconds in out) and not any("Traceback" in e for _, e, _ in out)
    assert len(errors) == 1, errors
    if how == "refuse":
        assert codes == [2, 2] and "test refusal at task on rank 1" in errors[0]
    else:
        assert codes[0] == 2 and codes[1] == -9 and "lost contact" in errors[0]


@pytest.mark.slow  # the same dealing as interaction's (default channel); here through run_cbs
def test_cbs_bracket_over_two_ranks_equals_one_process(tmp_path):
    """`dfmp2 run --basis cc-pv[dt]z` under torchrun: each basis on its own rank, the extrapolated
    energies equal one process's bit for bit."""
    mol = tmp_path / "w.xyz"
    mol.write_text(WATER)
    res = {}
    for ranks in (1, 2):
        out = tmp_path / f"cbs-{ranks}.json"
        args = [str(mol), "--basis", "cc-pv[dt]z", "--cpu-blas", "torch", "-q", "--json", str(out)]
        p, _ = _torchrun(tmp_path, ranks, args, "run")
        assert p.returncode == 0, p.stderr[-3000:]
        res[ranks] = json.loads(out.read_text())
    assert res[2]["energies"] == res[1]["energies"]
    assert [c["energies"] for c in res[2]["components"]] == [c["energies"] for c in res[1]["components"]]


# ---- groups of ranks: each run of a task-parallel command over a group --------------------
IE_BASE = [str(DIMER), "--fragments", "1-3,4-6", "--cpu-blas", "torch", "-q"]
IE_ARGS = [*IE_BASE, "--basis", "sto-3g"]


@pytest.mark.heavy
@pytest.mark.parametrize("basis", ["sto-3g", "cc-pv[dt]z"])
def test_interaction_in_groups_of_two_ranks_equals_one_process(tmp_path, basis):
    """`torchrun --nproc-per-node 4 -m dfmp2 interaction --ranks-per-run 2`: the 5 runs dealt to 2
    groups of 2 ranks (3 and 2 runs), each run split over its group (the default split SCF, B and
    the pair step over 2 ranks), so every energy equals one process's bit for bit; each run says
    which group ran it. A CBS bracket's bases run in turn within the run's group. Oversubscribed
    here (4 ranks on 2 cores): correctness, not speed."""
    outs = {}
    for ranks, extra in ((1, ["--basis", basis]), (4, ["--basis", basis, "--ranks-per-run", "2"])):
        out = tmp_path / f"ie-{ranks}.json"
        p, _ = _torchrun(tmp_path, ranks, [*IE_BASE, *extra, "--json", str(out)], "interaction")
        assert p.returncode == 0, p.stderr[-3000:]
        outs[ranks] = json.loads(out.read_text())
    one, four = outs[1], outs[4]
    assert [r["result"]["energies"] for r in four["runs"]] == [r["result"]["energies"] for r in one["runs"]]
    assert four["interaction_energies"] == one["interaction_energies"]
    assert four["ran"]["ranks"] == {"world_size": 4, "ranks_per_run": 2, "runs_per_group": [3, 2]}
    if basis == "sto-3g":  # a bracket's result holds its bases' runs (components)
        groups = [r["result"]["ran"]["distributed"]["group_of_ranks"] for r in four["runs"]]
        assert groups == [[0, 1], [2, 3], [0, 1], [2, 3], [0, 1]], groups  # run k on group k mod 2
        assert all(r["result"]["ran"]["distributed"]["world_size"] == 2 for r in four["runs"])


@pytest.mark.heavy
@pytest.mark.parametrize("how", ["refuse", "kill"])
def test_a_failing_run_in_a_group_ends_every_rank(tmp_path, how):
    """4 ranks in groups of 2, rank 1 failing as its group's run starts (the test hook): a refusal is
    agreed within its group and then over all ranks (one error line, from rank 1; exit 2
    everywhere); a killed rank ends its group's other rank at once and the other group at the
    round's gather (each survivor one line naming the lost contact). Nothing waits for a timeout."""
    args = [*IE_ARGS, "--ranks-per-run", "2"]
    # 4 processes on 2 cores beside another test worker take 25-34 s to start and end: the join
    # timeout is 120 s here, and 60 s (or the 90 s kill) tells an end from a wait for it
    out = _launch(
        tmp_path, [args] * 4, command="interaction", DFMP2_TEST_FAULT=f"task:1:{how}", DFMP2_DIST_TIMEOUT_S="120"
    )
    codes, errors = [rc for rc, _, _ in out], _error_lines(out)
    assert all(seconds < 60 for _, _, seconds in out), out
    assert not any("Traceback" in e for _, e, _ in out)
    if how == "refuse":
        assert codes == [2, 2, 2, 2] and errors == ["error: test refusal at task on rank 1"], (codes, errors)
    else:
        assert codes[1] == -9 and codes[0] == codes[2] == codes[3] == 2, codes
        assert len(errors) == 3 and all("lost contact" in e for e in errors), errors


@pytest.mark.heavy
def test_groups_that_do_not_divide_the_ranks_are_refused(tmp_path):
    """3 ranks, --ranks-per-run 2: refused on every rank before any run, one error line (rank 0's)."""
    out = _launch(tmp_path, [[*IE_ARGS, "--ranks-per-run", "2"]] * 3, command="interaction")
    assert [rc for rc, _, _ in out] == [2, 2, 2], out
    lines = _error_lines(out)
    assert len(lines) == 1 and "--ranks-per-run 2 must divide the number of ranks (3 here)" in lines[0], lines


@pytest.mark.parametrize(
    "command, args, says",
    [
        ("run", [], "--ranks-per-run 2 does not fit a run over 1 rank(s)"),
        ("interaction", ["--fragments", "1-3,4-6"], "--ranks-per-run 2 must divide the number of ranks (1 here)"),
    ],
)
def test_ranks_per_run_in_one_process_is_refused(tmp_path, command, args, says):
    """One process with --ranks-per-run 2: one error line, exit 2, before any integral."""
    cmd = [sys.executable, "-m", "dfmp2", command, str(DIMER), *args, *SMALL_ARGS, "--ranks-per-run", "2"]
    p = subprocess.run(cmd, env=_env(tmp_path), capture_output=True, text=True, timeout=LIMIT_S, cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and says in lines[0], p.stderr
    assert "DF-RHF" not in p.stdout + p.stderr  # refused before the SCF


SMALL_ARGS = ["--basis", "sto-3g", "--cpu-blas", "torch", "-q"]


@pytest.mark.heavy  # two processes, 6 s each: the default channel keeps its 300 s budget
@pytest.mark.parametrize("bad_rank", [0, 1])
def test_a_rank_refusing_its_command_line_ends_the_others_at_once(tmp_path, bad_rank):
    """Ranks started by hand, one given a flag that does not exist (click refuses it before the rank
    can join): every rank exits 2 within seconds, not at the 1800 s join timeout, rank 0 saying why
    in one line."""
    (tmp_path / "water.xyz").write_text(WATER)
    good = [str(tmp_path / "water.xyz"), *ARGS]
    argsets = [good, good]
    argsets[bad_rank] = [*good, "--no-such-flag"]
    res = _launch(tmp_path, argsets, DFMP2_DIST_TIMEOUT_S="1800")
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "--no-such-flag" in lines[0], res
    assert not any("Traceback" in err for _, err, _ in res), res
    assert max(t for _, _, t in res) < 30, res


# ---------------------------------------------------------------- the ranks agree on their input
SMALL = ["--basis", "sto-3g", "--cpu-blas", "torch", "-q"]


def _refused_on_every_rank(tmp_path, res, *fragments, limit_s=30):
    """Every rank exit 2 within ``limit_s`` (its imports included), one error line in all (rank 0's)
    naming what differs, no JSON."""
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1, res
    assert "the ranks did not read the same input" in lines[0], lines
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    assert not any("Traceback" in err for _, err, _ in res), res
    assert max(t for _, _, t in res) < limit_s, res
    assert not list(tmp_path.glob("*.json"))


@pytest.mark.heavy
@pytest.mark.parametrize("dist_scf", ["split", "replicated"])
def test_ranks_reading_coordinates_1e6_apart_are_refused(tmp_path, dist_scf):
    """Two ranks whose files differ by 1e-6 Å in one coordinate (a node-local copy): refused before
    any integral (mixed molecules printed energies 1.9e-5 Eh off, or aborted)."""
    (tmp_path / "a.xyz").write_text(WATER)
    (tmp_path / "b.xyz").write_text(WATER.replace("0.117", "0.117001"))
    args = [*SMALL, "--dist-scf", dist_scf, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [[str(tmp_path / "a.xyz"), *args], [str(tmp_path / "b.xyz"), *args]])
    _refused_on_every_rank(tmp_path, res, "they differ in the coordinates (bit for bit)", "rank 0 vs rank 1")


@pytest.mark.heavy
def test_an_option_on_one_rank_only_is_refused(tmp_path):
    """``--frozen-core`` on rank 1 only (two argv, as a launcher script picking them by RANK would):
    refused, naming the option and its flag (a gloo abort before)."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, [*args, "--frozen-core"]])
    _refused_on_every_rank(
        tmp_path, res, "they differ in option frozen_core (rank 0: False vs rank 1: True)", "--frozen-core"
    )


# A workflow's own parameters that change a number (outside RunOptions): a rank given another one
# mixed into the result with exit 0 (water's frequencies 1663 -> 2034 cm-1 with another --step, the
# water dimer's CP dE(MP2) -198.5 kcal/mol with other fragment charges). Each is refused in one line
# naming its flag, before the SCF (before any evaluation, any run).
@pytest.mark.heavy
def test_a_gradient_method_on_one_rank_only_is_refused(tmp_path):
    """``dfmp2 gradient --method scs-mp2`` on rank 1 only: refused before the SCF (the gradient was
    3e-4 Eh/bohr off, exit 0)."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, [*args, "--method", "scs-mp2"]], command="gradient")
    _refused_on_every_rank(tmp_path, res, "they differ in option method (rank 0: 'mp2' vs rank 1: 'scs-mp2')")
    assert _error_lines(res)[0].endswith("(--method)"), res


@pytest.mark.heavy
def test_a_frequency_step_on_one_rank_only_is_refused(tmp_path):
    """``dfmp2 frequencies --step 0.01`` on rank 1 only: refused before any evaluation."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, [*args, "--step", "0.01"]], command="frequencies")
    _refused_on_every_rank(tmp_path, res, "they differ in option step (rank 0: 0.005 vs rank 1: 0.01)", "(--step)")


@pytest.mark.heavy
def test_a_frequency_method_on_one_rank_only_is_refused(tmp_path):
    """``dfmp2 frequencies --method sos-mp2`` on rank 1 only: refused before any evaluation."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, [*args, "--method", "sos-mp2"]], command="frequencies")
    _refused_on_every_rank(tmp_path, res, "option method (rank 0: 'mp2' vs rank 1: 'sos-mp2')", "(--method)")


DIMER_LINES = DIMER.read_text().splitlines()


def _dimer_with_states(first: str, second: str) -> str:
    """The S22 water dimer with a 'charge multiplicity' line opening each fragment, '--' between them."""
    head, atoms = DIMER_LINES[:2], DIMER_LINES[2:]
    return "\n".join([*head, first, *atoms[:3], "--", second, *atoms[3:]]) + "\n"


@pytest.mark.heavy
@pytest.mark.parametrize("how", ["option", "xyz"])
def test_fragment_charges_on_one_rank_only_are_refused(tmp_path, how):
    """``dfmp2 interaction`` with other fragment charges on rank 1 (``--fragment-charges``, or the
    XYZ's 'charge multiplicity' lines): refused before any run (CP dE(MP2) -198.5 kcal/mol, exit 0)."""
    out = ["--basis", "sto-3g", "--cpu-blas", "torch", "-q", "--json", str(tmp_path / "out.json")]
    if how == "option":
        args = [str(DIMER), "--fragments", "1-3,4-6", *out]
        other = ["--fragment-charges", "1,-1", "--fragment-multiplicities", "2,2"]
        argsets = [[*args, "--fragment-charges", "0,0"], [*args, *other]]
    else:
        (tmp_path / "a.xyz").write_text(_dimer_with_states("0 1", "0 1"))
        (tmp_path / "b.xyz").write_text(_dimer_with_states("1 2", "-1 2"))
        argsets = [[str(tmp_path / "a.xyz"), *out], [str(tmp_path / "b.xyz"), *out]]
    res = _launch(tmp_path, argsets, command="interaction")
    says = "they differ in option fragment_charges (rank 0: '0,0' vs rank 1: '1,-1')"
    _refused_on_every_rank(tmp_path, res, says, "(--fragment-charges)")


@pytest.mark.heavy
@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--max-steps", "3"], "option max_steps (rank 0: 100 vs rank 1: 3)"),
        (["--convergence", "gau_tight"], "option convergence (rank 0: 'default' vs rank 1: 'gau_tight')"),
    ],
)
def test_optimize_criteria_on_one_rank_only_are_refused(tmp_path, extra, says):
    """``dfmp2 optimize`` with another ``--max-steps`` or ``--convergence`` on rank 1: refused
    before the first step's SCF (the ranks would stop at other steps)."""
    (tmp_path / "water.xyz").write_text(DISTORTED)
    args = [str(tmp_path / "water.xyz"), *SMALL, "-o", str(tmp_path / "w.xyz"), "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, [*args, *extra]], command="optimize")
    _refused_on_every_rank(tmp_path, res, says, limit_s=45)  # geomeTRIC's import too, on a loaded machine
    assert not (tmp_path / "w.xyz").exists() and not (tmp_path / "w.traj.xyz").exists()


def _differs(a: dict, b: dict):
    from dfmp2 import distributed

    return distributed.differing([distributed.digests(a), distributed.digests(b)])


def test_workflow_parameters_are_agreed_on_with_their_flags(monkeypatch):
    """The light test of the agreement on a workflow's own parameters (the multi-rank tests above
    are heavy): what a rank sends (``World.agree``'s content) holds the gradient's method (through
    ``run_gradient``, before its SCF), optimize's criteria, the frequency step and the fragment
    charges, each under the RunOptions-style key that names its flag in the refusal."""
    import dfmp2.drivers.gradient as gradient_driver
    import dfmp2.workflows.optimize as optimize_wf
    from dfmp2.drivers.plan import input_content
    from dfmp2.io.xyz import parse_xyz
    from dfmp2.options import RunOptions
    from dfmp2.workflows import frequencies, interaction

    water, options = parse_xyz(WATER), RunOptions(basis="sto-3g", cpu_blas="torch")  # no BLAS probe
    sent = []

    class Stop(Exception):
        pass

    def stop(job, **kw):  # the energy run's agreement comes first in it: what it would send
        sent.append(input_content(job))
        raise Stop

    monkeypatch.setattr(gradient_driver, "run_energy", stop)
    for method in ("mp2", "scs-mp2"):
        with pytest.raises(Stop):
            gradient_driver.run_gradient(water, options, method=method)
    line, option = _differs(*sent)
    assert "they differ in option method (rank 0: 'mp2' vs rank 1: 'scs-mp2')" in line and option == "method", line

    passed = []

    def step(*args, **kw):
        passed.append(kw["agreed"])
        raise Stop

    monkeypatch.setattr(optimize_wf, "run_gradient", step)
    with pytest.raises(Stop):
        optimize_wf.optimize(parse_xyz(DISTORTED), options, max_steps=7, convergence="gau_tight")
    assert passed == [{"option max_steps": 7, "option convergence": "gau_tight"}]

    freq = [frequencies.agreed_content(water, options, "mp2", step, 298.15, 101325.0) for step in (0.005, 0.01)]
    line, option = _differs(*freq)
    assert "option step (rank 0: 0.005 vs rank 1: 0.01)" in line and option == "step", line

    dimer = parse_xyz(DIMER.read_text())
    frags = [interaction.resolve_fragments(dimer, "1-3,4-6", q, m) for q, m in (("0,0", None), ("1,-1", "2,2"))]
    line, option = _differs(*(interaction.agreed_content(dimer, f, options) for f in frags))
    assert "option fragment_charges (rank 0: '0,0' vs rank 1: '1,-1')" in line and option == "fragment_charges", line


def test_ranks_agree_on_what_the_measured_fp32_ratio_decided_not_on_the_ratio():
    """Each GPU measures its own SGEMM/DGEMM ratio (a few % apart from rank to rank): the ranks agree
    on the precision it chose, so 0.93 and 0.95 (both fp64) agree and 0.93 against 1.9 (mixed) do not."""
    from dfmp2.drivers.job import prepare
    from dfmp2.drivers.plan import input_content
    from dfmp2.io.xyz import parse_xyz
    from dfmp2.options import RunOptions
    from dfmp2.scf.settings import ScfPlan

    job = prepare(parse_xyz(WATER), RunOptions(basis="sto-3g", cpu_blas="torch"))
    sent = [input_content(job, ScfPlan(fp32_copy=True, fp32_speedup=r)) for r in (0.93, 0.95, 1.9)]
    assert sent[0] == sent[1]
    line, _ = _differs(sent[0], sent[2])
    assert "the SCF precision the measured SGEMM/DGEMM ratio chose" in line and "'mixed'" in line, line


def test_digests_name_what_differs_and_where():
    from dfmp2 import distributed

    same = {"the atoms": ["O", "H"], "coordinates": [0.1, 0.2], "option basis": "sto-3g"}
    d = [distributed.digests(same) for _ in range(3)]
    assert distributed.differing(d) is None
    d[1] = distributed.digests({**same, "coordinates": [0.1, 0.2 + 2**-52 * 0.2]})  # one bit
    d[2] = distributed.digests({**same, "option basis": "cc-pvdz"})
    line, option = distributed.differing(d)
    assert "in coordinates (ranks 0, 2 vs rank 1), and in option basis;" in line, line
    assert option is None
    line, option = distributed.differing([d[0], d[0], d[2]])
    assert "in option basis (ranks 0, 1: 'sto-3g' vs rank 2: 'cc-pvdz');" in line and option == "basis"


DISTORTED = "3\nwater\nO 0.000 0.000 0.10\nH 0.000 0.78 -0.47\nH 0.000 -0.74 -0.46\n"


@pytest.mark.heavy
def test_optimize_over_two_ranks_takes_one_process_s_steps(tmp_path):
    """``dfmp2 optimize`` over 2 ranks: each step's gradient over the ranks (bitwise one
    process's), so geomeTRIC takes the same steps on every rank; the final geometry, trajectory and
    JSON equal one process's; rank 0 alone writes and prints."""
    (tmp_path / "w.xyz").write_text(DISTORTED)
    docs = {}
    for ranks in (1, 2):
        args = [str(tmp_path / "w.xyz"), *SMALL, "--json", str(tmp_path / f"o{ranks}.json")]
        args += ["-o", str(tmp_path / f"o{ranks}.xyz"), "--trajectory", str(tmp_path / f"t{ranks}.xyz")]
        p, _ = _torchrun(tmp_path, ranks, args, "optimize")
        assert p.returncode == 0, p.stderr[-3000:]
        assert p.stdout.count("converged in") == 1, p.stdout
        docs[ranks] = json.loads((tmp_path / f"o{ranks}.json").read_text())
    assert docs[2]["optimization"] == docs[1]["optimization"] and docs[1]["optimization"]["steps"] > 1
    assert docs[2]["gradient"]["gradient"] == docs[1]["gradient"]["gradient"]
    for name in ("o{}.xyz", "t{}.xyz"):
        assert (tmp_path / name.format(2)).read_text() == (tmp_path / name.format(1)).read_text()


@pytest.mark.heavy
def test_optimize_not_converged_over_ranks_one_error_line(tmp_path):
    """Not converged in --max-steps 1 over 2 ranks: the same on both ranks; one error line (rank
    0's), exit 2 on both, rank 0 writes the last geometry and the JSON (converged false)."""
    (tmp_path / "w.xyz").write_text(DISTORTED)
    args = [str(tmp_path / "w.xyz"), *SMALL, "--max-steps", "1", "--json", str(tmp_path / "o.json")]
    res = _launch(tmp_path, [args, args], command="optimize")
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "did not converge in 1 steps" in lines[0], lines
    assert json.loads((tmp_path / "o.json").read_text())["optimization"]["converged"] is False
    assert (tmp_path / "w.opt.xyz").exists()


@pytest.mark.heavy
@pytest.mark.parametrize("command", ["run", "gradient"])
def test_cuda_over_ranks_without_a_gpu_per_rank_is_one_line(tmp_path, command):
    """--device cuda over 2 ranks on a node without a GPU for each rank (here: none, or one):
    one error line naming the GPUs found, exit 2 on both, no traceback (a torch AttributeError from
    torch.cuda.set_device before)."""
    import torch

    if torch.cuda.device_count() >= 2:
        pytest.skip("this node has a GPU for each of 2 ranks")
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), "--basis", "sto-3g", "--device", "cuda", "-q"]
    res = _launch(tmp_path, [args, args], command=command)
    assert [rc for rc, _, _ in res] == [2, 2], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "one GPU per rank" in lines[0] and "CUDA GPU(s)" in lines[0], lines
    assert not any("Traceback" in err for _, err, _ in res), res


# ---------------------------------------------------------------- the gradient over ranks
def _gradient(tmp_path, ranks: int, xyz: str, name: str, **extra) -> dict:
    """``dfmp2 gradient`` (cc-pVDZ, default options) on ``ranks`` ranks, ``extra`` in its
    environment: its JSON, validated."""
    mol = tmp_path / f"{name}.xyz"
    mol.write_text(xyz)
    out = tmp_path / f"grad-{name}-{ranks}.json"
    args = [str(mol), "--basis", "cc-pvdz", "--cpu-blas", "torch", "-q", "--json", str(out)]
    p, _ = _torchrun(tmp_path, ranks, args, "gradient", **extra)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.count("nuclear gradient of E(MP2)") == 1, p.stdout  # rank 0 alone prints
    return read_checked(out)


def _check_gradients(tmp_path, xyz, name, rank_counts, **extra):
    one = _gradient(tmp_path, 1, xyz, name, **extra)
    assert "ranks" not in one["gradient"]["ran"]
    for ranks in rank_counts:
        res = _gradient(tmp_path, ranks, xyz, name, **extra)
        assert res["gradient"]["gradient"] == one["gradient"]["gradient"], (ranks, name)  # bit for bit
        assert res["gradient"]["energy"] == one["gradient"]["energy"] and res["energies"] == one["energies"]
        r = res["gradient"]["ran"]["ranks"]
        assert r["world_size"] == ranks and r["comm_rank"]["bytes"] > 0
        assert any("derivative integrals" in s for s in r["split"])
        assert any("pair loop" in s for s in r["split"])


@pytest.mark.heavy
@pytest.mark.parametrize("xyz,name,ranks", [(WATER, "water", [3]), (OH, "oh", [2])], ids=["water", "oh"])
def test_gradient_over_ranks_is_one_process_s(tmp_path, xyz, name, ranks):
    """The RHF (water) and UHF (OH) gradients over ranks: bit for bit one process's (the pair
    loop's blocks and the derivative integrals' groups added in one fixed order, equal threads)."""
    _check_gradients(tmp_path, xyz, name, ranks)


@pytest.mark.heavy
@pytest.mark.parametrize("xyz,name,ranks", [(WATER, "water", [2, 3]), (OH, "oh", [2])], ids=["water", "oh"])
def test_gradient_with_its_jk_factor_split_over_ranks_is_one_process_s(tmp_path, xyz, name, ranks):
    """The plan with the JK factor split over the ranks in the SCF's fixed groups of rows (issue
    42: the gradient's memory per rank; forced by the test hook, where it would otherwise be chosen
    only when the whole factor does not fit a rank): its fit, the Z-vector's J/K and the JK
    derivative's first pass over each rank's groups, added in group order. Bit for bit one
    process's run of the same forms over the whole factor, RHF and UHF."""
    _check_gradients(tmp_path, xyz, name, ranks, DFMP2_TEST_SPLIT_JK="1")
    plans = {}
    for path in tmp_path.glob(f"grad-{name}-*.json"):
        doc = json.loads(path.read_text())
        plans[int(path.stem.rsplit("-", 1)[1])] = (doc["gradient"]["ran"]["plan"], doc["gradient"]["ran"].get("ranks"))
    assert plans[1][0]["jk_factor"].startswith("in memory") and plans[1][0]["zvector"] == "ao"
    naux_jk = {"water": 116, "oh": 93}[name]  # cc-pVDZ-JKFIT functions
    for n in ranks:
        plan, split = plans[n]
        assert plan["jk_factor"].startswith("split over the ranks") and 0 < plan["jk_rows_per_rank"] < naux_jk
        assert any("JK factor" in s for s in split["split"]) and "JK factor" not in split["on_every_rank"]


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["water", "nh2"])
def test_a_double_hybrid_gradient_over_ranks_is_one_process_s(tmp_path, name):
    """B2PLYP's gradient (RKS water, cc-pVDZ; UKS NH2) over 2 ranks: the PT2 part's pair loops and
    derivative integrals split, the KS part (PySCF's) on every rank; one process's gradient to
    1e-12 Eh/bohr (it crashed at its ranks record)."""
    (tmp_path / f"{name}.xyz").write_text({"water": WATER, "nh2": NH2}[name])
    docs = {}
    for ranks in (1, 2):
        out = tmp_path / f"dh-{ranks}.json"
        args = [str(tmp_path / f"{name}.xyz"), "--method", "b2plyp", "--basis", "cc-pvdz", "--cpu-blas", "torch", "-q"]
        p, _ = _torchrun(tmp_path, ranks, [*args, "--json", str(out)], "gradient")
        assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
        docs[ranks] = read_checked(out)
    one, two = (np.array(docs[n]["gradient"]["gradient"]) for n in (1, 2))
    assert np.abs(one - two).max() < 1e-12, np.abs(one - two).max()
    assert docs[2]["gradient"]["ran"]["ranks"]["world_size"] == 2
    assert docs[2]["gradient"]["double_hybrid"] is not None
    assert docs[2]["gradient"]["ran"]["reference"] == {"water": "rks", "nh2": "uks"}[name]


@pytest.mark.slow
@pytest.mark.parametrize("xyz,name", [(WATER, "water"), (OH, "oh")], ids=["water", "oh"])
def test_gradient_over_two_and_three_ranks(tmp_path, xyz, name):
    _check_gradients(tmp_path, xyz, name, [2, 3])


@pytest.mark.heavy
def test_a_rank_killed_mid_gradient_ends_the_other(tmp_path):
    """Rank 1 killed at its first block of the gradient (after the energy): rank 0 stops within
    30 s with one error line naming the lost contact, exit 2, no JSON."""
    (tmp_path / "water.xyz").write_text(WATER)
    args = [str(tmp_path / "water.xyz"), *SMALL, "--json", str(tmp_path / "out.json")]
    res = _launch(tmp_path, [args, args], command="gradient", DFMP2_TEST_FAULT="gradient:1:kill")
    assert [rc for rc, _, _ in res] == [2, -9], res
    lines = _error_lines(res)
    assert len(lines) == 1 and "lost contact" in lines[0] and "gradient" in lines[0], lines
    assert not any("Traceback" in err for _, err, _ in res), res
    assert max(t for _, _, t in res) < 30 and not list(tmp_path.glob("*.json"))
