"""Checkpoint and resume: a run killed mid pair-loop (a real subprocess and a signal) resumes to
the bitwise energy of an uninterrupted run; finished work is not redone; missing, corrupted and
mismatched checkpoints are refused with one clear line."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import integrals
from dfmp2.interfaces.api import run
from dfmp2.io import checkpoint
from dfmp2.io.checkpoint import CheckpointError
from dfmp2.options import RunOptions
from dfmp2.scf import driver, pyscf_scf, rhf

ROOT = Path(__file__).resolve().parents[2]
INPUTS = ROOT / "inputs"
WATER = INPUTS / "water.xyz"
DIMER = INPUTS / "water_clusters" / "h2o_02.xyz"
OCC_BLOCK, J3C_MB = 2, 0.05  # the dimer (nocc 10) in 5 occupied blocks: 15 block pairs
BLOCKS = dict(occ_block_max=OCC_BLOCK, j3c_block_mb=J3C_MB)
BLOCK_ARGS = ["--occ-block-max", str(OCC_BLOCK), "--j3c-block-mb", str(J3C_MB)]
NPAIRS = 15
PAIR_KERNEL = linalg.mp2_pair_energy

# A dfmp2 run in its own process with the test's blocking, one thread (as the tests here), and
# each pair kernel call announced on stdout and slowed down, so a signal lands mid pair-loop.
# SIGINT gets Python's default handler back, as a run started from a terminal has it: a shell
# without job control starts background jobs with SIGINT ignored and the ignore is inherited
# (pytest run as `... &` from a script), and dfmp2 rightly keeps a user's ignored SIGINT.
CHILD = """
import signal, sys, time, torch
signal.signal(signal.SIGINT, signal.default_int_handler)
torch.set_num_threads(1)
from dfmp2 import linalg
_orig = linalg.mp2_pair_energy
def slow(*a, **k):
    r = _orig(*a, **k)
    print("PAIR", flush=True)
    time.sleep(0.25)
    return r
linalg.mp2_pair_energy = slow
from dfmp2.cli.main import main
main(sys.argv[1:], prog_name="dfmp2")
"""


@pytest.fixture(autouse=True)
def one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def uninterrupted():
    """The dimer's energies without any checkpoint, per (storage, precision)."""
    cache = {}

    def get(precision="fp64"):
        if precision not in cache:
            old = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                cache[precision] = run(DIMER, RunOptions(**BLOCKS, precision=precision))
            finally:
                torch.set_num_threads(old)
        return cache[precision]

    return get


def count_pair_calls(monkeypatch, fail_after=None, exc=KeyboardInterrupt):
    calls = []

    def counted(*a, **k):
        if fail_after is not None and len(calls) == fail_after:
            raise exc("interrupted by the test")
        calls.append(1)
        return PAIR_KERNEL(*a, **k)

    monkeypatch.setattr(linalg, "mp2_pair_energy", counted)
    return calls


def same_bits(a, b):
    return a.e_os.hex() == b.e_os.hex() and a.e_ss.hex() == b.e_ss.hex() and a.e_hf.hex() == b.e_hf.hex()


# ------------------------------------------------------------------ in-process interruption
@pytest.mark.parametrize("storage", ["memory", "disk"])
def test_interrupted_run_resumes_to_the_same_bits_without_redoing_work(tmp_path, monkeypatch, uninterrupted, storage):
    ref = uninterrupted()
    ck = tmp_path / "run.h5"
    count_pair_calls(monkeypatch, fail_after=6)
    with pytest.raises(KeyboardInterrupt):
        run(DIMER, RunOptions(**BLOCKS, storage=storage, checkpoint=str(ck), scratch_dir=str(tmp_path)))
    with h5py.File(ck, "r") as f:
        assert f["pairs/done"][...].sum() == 6 and f["B"].attrs["complete"] == 1
        assert f.attrs["complete"] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.h5"]

    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    monkeypatch.setattr(integrals.HostEngine, "blocks", lambda *a, **k: pytest.fail("B is in the checkpoint"))
    calls = count_pair_calls(monkeypatch)
    # resumed with the other storage: where B lives does not change the bits
    other = "disk" if storage == "memory" else "memory"
    r = run(DIMER, RunOptions(**BLOCKS, storage=other, resume=str(ck)))
    assert len(calls) == NPAIRS - 6
    assert r.ran["storage"]["from_checkpoint"] == {"scf": True, "B": True, "pairs": 6}
    assert same_bits(r, ref)
    with h5py.File(ck, "r") as f:
        assert f.attrs["complete"] == 1 and f["pairs/done"][...].all()


def test_interrupt_during_fit_rebuilds_b_but_keeps_the_scf(tmp_path, monkeypatch, uninterrupted):
    ref = uninterrupted()
    ck = tmp_path / "run.h5"
    from dfmp2.df import outofcore

    orig = outofcore.fit_blocks
    monkeypatch.setattr(outofcore, "fit_blocks", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        run(DIMER, RunOptions(**BLOCKS, storage="disk", checkpoint=str(ck)))
    monkeypatch.setattr(outofcore, "fit_blocks", orig)
    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    r = run(DIMER, RunOptions(**BLOCKS, storage="disk", resume=str(ck)))
    assert r.ran["storage"]["from_checkpoint"] == {"scf": True, "B": False, "pairs": 0}
    assert same_bits(r, ref)


def test_fp32_checkpoint_resumes_bitwise(tmp_path, monkeypatch, uninterrupted):
    ck = tmp_path / "run.h5"
    count_pair_calls(monkeypatch, fail_after=9)
    with pytest.raises(KeyboardInterrupt):
        run(DIMER, RunOptions(**BLOCKS, precision="fp32", storage="disk", checkpoint=str(ck)))
    count_pair_calls(monkeypatch)
    r = run(DIMER, RunOptions(**BLOCKS, precision="fp32", resume=str(ck)))
    assert same_bits(r, uninterrupted("fp32"))
    with h5py.File(ck, "r") as f:
        assert f["B"].dtype == np.float32


# ------------------------------------------------------------------ a real process and a signal
def start_child(args, tmp_path, path=DIMER):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen(
        [sys.executable, str(script), "run", str(path)] + BLOCK_ARGS + args,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_after_pairs(proc, npairs, sig):
    seen = 0
    for line in proc.stdout:
        if line.strip() == "PAIR":
            seen += 1
            if seen == npairs:
                proc.send_signal(sig)
                break
    _out, err = proc.communicate(timeout=120)
    return proc.returncode, err


@pytest.mark.heavy
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_killed_process_resumes_to_the_uninterrupted_energy(tmp_path, uninterrupted, sig):
    ck = tmp_path / "run.h5"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = start_child(["--storage", "disk", "--checkpoint", str(ck), "--scratch", str(scratch), "-q"], tmp_path)
    code, err = kill_after_pairs(proc, 4, sig)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    else:
        assert code == 143, err  # 128 + SIGTERM, not Ctrl-C's 130
        assert err.strip().splitlines()[-1].startswith("error: interrupted by SIGTERM; continue with:")
        assert f"--resume {ck}" in err
    with h5py.File(ck, "r") as f:  # opens after SIGKILL too
        ndone = int(f["pairs/done"][...].sum())
    assert 3 <= ndone < NPAIRS
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["run", str(DIMER), "--resume", str(ck), "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    e = json.loads(out.read_text())["energies"]
    ref = uninterrupted()
    assert (e["e_corr_os"], e["e_corr_ss"], e["e_hf"]) == (ref.e_os, ref.e_ss, ref.e_hf)
    if sig == signal.SIGTERM:
        assert list(scratch.iterdir()) == []


@pytest.mark.heavy
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_removes_temporary_files(tmp_path, sig):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = start_child(["--storage", "disk", "--precision", "fp32", "--scratch", str(scratch)], tmp_path)
    code, err = kill_after_pairs(proc, 2, sig)
    by = " by SIGTERM" if sig == signal.SIGTERM else ""
    assert code == 128 + sig and err.strip().splitlines()[-1] == f"error: interrupted{by}", err
    assert "Traceback" not in err
    assert list(scratch.iterdir()) == []


# ------------------------------------------------------------------ refused checkpoints
@pytest.fixture(scope="module")
def water_checkpoint(tmp_path_factory):
    ck = tmp_path_factory.mktemp("ck") / "water.h5"
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        first = run(WATER, RunOptions(**BLOCKS, checkpoint=str(ck)))
    finally:
        torch.set_num_threads(old)
    return ck, first


def copy(src, dst):
    dst.write_bytes(Path(src).read_bytes())
    return dst


def test_complete_checkpoint_gives_the_result_again(water_checkpoint, monkeypatch, tmp_path):
    ck, first = water_checkpoint
    ck = copy(ck, tmp_path / "c.h5")
    calls = count_pair_calls(monkeypatch)
    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("no SCF on resume"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("no SCF on resume"))
    r = run(WATER, RunOptions(**BLOCKS, resume=str(ck)))
    assert calls == [] and same_bits(r, first)
    assert "checkpoint" in r.timings and "scf" not in r.timings


def cli_error(args):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and "Traceback" not in res.output
    return lines[-1]


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--basis", "cc-pvtz"], 'basis is "cc-pvdz" in the checkpoint but "cc-pvtz" here'),
        (["--precision", "fp32"], 'precision is "fp64" in the checkpoint but "fp32" here'),
        (["--frozen-core"], "frozen_core is false in the checkpoint but true here"),
        (["--scf", "exact"], 'scf_mode is "df"'),
        (["--scf", "pyscf-df"], 'scf_mode is "df" in the checkpoint but "pyscf-df" here'),
        (["--charge", "2"], "charge is 0 in the checkpoint but 2 here"),
        # a non-default option against a checkpoint of the default ("another dfmp2 version?")
        (["--scf-conv-tol-grad", "1e-8"], "scf_conv_tol_grad is 1e-09 in the checkpoint but 1e-08 here"),
        (["--scf-screen", "1e-10"], "scf_screen is 1e-12 in the checkpoint but 1e-10 here"),
    ],
)
def test_mismatched_settings_are_refused(water_checkpoint, tmp_path, args, fragment):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    msg = cli_error(["run", str(WATER), "--resume", str(ck)] + args)
    assert "was written for another run" in msg and fragment in msg, msg
    assert msg.endswith(f"{args[0]})") or args[0] == "--frozen-core", msg  # the option's flag too


def test_non_default_checkpoint_resumed_with_the_default_is_refused(tmp_path):
    """The reverse of the above (silently accepted): a checkpoint of --scf-conv-tol-grad
    1e-8 resumed without it names the option, its two values and its flag."""
    ck = tmp_path / "tol.h5"
    args = ["run", str(WATER), "--basis", "sto-3g", "--cpu-blas", "torch", "-q"]
    res = CliRunner().invoke(main, [*args, "--scf-conv-tol-grad", "1e-8", "--checkpoint", str(ck)])
    assert res.exit_code == 0, res.output
    msg = cli_error([*args, "--resume", str(ck)])
    assert "scf_conv_tol_grad is 1e-08 in the checkpoint but 1e-09 here" in msg, msg
    assert msg.endswith("(--resume, --scf-conv-tol-grad)"), msg
    assert "another dfmp2 version" not in msg


def test_other_molecule_is_refused(water_checkpoint, tmp_path):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    moved = tmp_path / "w.xyz"
    moved.write_text(WATER.read_text().replace("0.763239", "0.763240"))
    msg = cli_error(["run", str(moved), "--resume", str(ck)])
    assert "the molecule differs at atom 2" in msg
    msg = cli_error(["run", str(INPUTS / "ammonia.xyz"), "--resume", str(ck)])
    assert "the molecule differs" in msg


def test_corrupted_checkpoints_are_refused(water_checkpoint, tmp_path):
    good = water_checkpoint[0]
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"not an hdf5 file at all" * 100)
    assert "not an HDF5 file" in cli_error(["run", str(WATER), "--resume", str(garbage)])

    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(good.read_bytes()[:1500])
    assert "is corrupted" in cli_error(["run", str(WATER), "--resume", str(truncated)])

    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["x"] = 1
    assert "not a dfmp2 checkpoint" in cli_error(["run", str(WATER), "--resume", str(other)])

    missing = copy(good, tmp_path / "missing.h5")
    with h5py.File(missing, "r+") as f:
        del f["scf/mo_energy"]
    assert "dataset 'scf/mo_energy' is missing" in cli_error(["run", str(WATER), "--resume", str(missing)])

    flipped = copy(good, tmp_path / "flipped.h5")
    with h5py.File(flipped, "r+") as f:
        offset = f["B"].id.get_offset()  # all pairs done: B is still checked whole
    with open(flipped, "r+b") as fh:  # one byte of B changed behind HDF5's back
        fh.seek(offset + 100)
        b = fh.read(1)
        fh.seek(offset + 100)
        fh.write(bytes([b[0] ^ 0xFF]))
    msg = cli_error(["run", str(WATER), "--resume", str(flipped), "--storage", "disk"])
    assert "block 0 of B fails its checksum" in msg


# every dataset of a finished checkpoint: if one is added, it must be added here (and checksummed)
DATASETS = ["B", "B_crc", "pairs/crc", "pairs/done", "pairs/sums", "scf/mo_coeff", "scf/mo_energy"]
# PySCF's chkfile layout beside ours (for a PySCF restart): never read back by dfmp2, so no checksum
PYSCF_DATASETS = ["mol", "scf/e_tot", "scf/mo_occ"]


def test_every_dataset_is_listed_for_the_flip_test(water_checkpoint):
    with h5py.File(water_checkpoint[0], "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
    assert sorted(names) == sorted(DATASETS + PYSCF_DATASETS)


def flip_byte(path, dataset, where=0.5):
    """Invert one byte of ``dataset``'s data in the file, behind HDF5's back."""
    with h5py.File(path, "r") as f:
        d = f[dataset]
        offset, nbytes = d.id.get_offset(), d.id.get_storage_size()
    assert offset is not None and nbytes > 0, dataset
    pos = offset + min(nbytes - 1, int(nbytes * where))
    with open(path, "r+b") as fh:
        fh.seek(pos)
        b = fh.read(1)
        fh.seek(pos)
        fh.write(bytes([b[0] ^ 0xFF]))


# B out of core is read block by block (HDF5B.verify), in memory copied whole: both ways for B
@pytest.mark.parametrize("dataset,storage", [(d, "memory") for d in DATASETS] + [("B", "disk"), ("B_crc", "disk")])
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_any_flipped_byte_of_a_finished_checkpoint_is_refused(
    water_checkpoint, tmp_path, monkeypatch, dataset, where, storage
):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    flip_byte(ck, dataset, where)
    monkeypatch.setattr(pyscf_scf, "run_rhf", lambda *a, **k: pytest.fail("no SCF on resume"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("no SCF on resume"))
    msg = cli_error(["run", str(WATER), "--resume", str(ck), "--storage", storage])
    assert "is corrupted" in msg and "remove the file" in msg, msg


@pytest.mark.parametrize(
    "obj,attr,value",
    [
        ("scf", "e_hf", lambda v: v + 1e-9),
        ("scf", "nocc", lambda v: v - 1),
        ("scf", "jk_auxbasis", lambda v: "def2-universal-jkfit"),
        ("scf", "cycles", lambda v: v + 1),
        ("B", "metric", lambda v: "eigh"),
        ("B", "metric_dropped", lambda v: v + 1),
        ("/", "occ_block", lambda v: v + 1),
        ("/", "fingerprint", lambda v: json.dumps(json.loads(v), indent=1)),  # same content, other bytes
    ],
)
def test_changed_attributes_are_refused(water_checkpoint, tmp_path, obj, attr, value):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    with h5py.File(ck, "r+") as f:
        f[obj].attrs[attr] = value(f[obj].attrs[attr])
    msg = cli_error(["run", str(WATER), "--resume", str(ck)])
    assert "is corrupted" in msg and "checksum" in msg, msg


def test_pair_sums_overwritten_as_in_the_issue_are_refused(water_checkpoint, tmp_path):
    """The issue's case: 4 bytes of /pairs/sums overwritten, then --resume (was exit 0, wrong E_corr)."""
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    with h5py.File(ck, "r") as f:
        offset = f["pairs/sums"].id.get_offset()
    with open(ck, "r+b") as fh:
        fh.seek(offset + 4)
        fh.write(b"\x00\x00\x80\x3f")
    assert "the sums of block pair 0 fails its checksum" in cli_error(["run", str(WATER), "--resume", str(ck)])


def test_checkpoint_of_an_older_format_is_refused(water_checkpoint, tmp_path):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    with h5py.File(ck, "r+") as f:
        f.attrs["format_version"] = 1
    assert "format version 1, this dfmp2 reads 2" in cli_error(["run", str(WATER), "--resume", str(ck)])


def test_missing_existing_and_conflicting_paths(water_checkpoint, tmp_path):
    ck = water_checkpoint[0]
    assert "does not exist" in cli_error(["run", str(WATER), "--resume", str(tmp_path / "nope.h5")])
    # the library's words name no CLI flag; ``option`` is the RunOptions field (the CLI adds its flag)
    with pytest.raises(CheckpointError, match="does not exist; start a run that writes a checkpoint") as info:
        checkpoint.Checkpoint.resume(tmp_path / "nope.h5", {})
    assert info.value.option == "resume" and " --" not in str(info.value)
    with pytest.raises(CheckpointError, match="already exists; resume it, or remove it") as info:
        checkpoint.Checkpoint.create(ck, {}, occ_block=OCC_BLOCK)
    assert info.value.option == "checkpoint" and " --" not in str(info.value)
    with pytest.raises(CheckpointError, match=r"written for another run: .*start afresh without resuming") as info:
        checkpoint.Checkpoint.resume(copy(ck, tmp_path / "c.h5"), {"charge": 1})
    assert info.value.option == ("resume", "charge") and " --" not in str(info.value)  # and the option that differs
    # the same refusal from a run, before any work
    assert "already exists; resume it" in cli_error(["run", str(WATER), "--checkpoint", str(ck)])
    assert "to resume are different files" in cli_error(
        ["run", str(WATER), "--checkpoint", str(tmp_path / "a.h5"), "--resume", str(ck)]
    )


@pytest.mark.parametrize("kind", ["device", "fifo", "directory"])
def test_non_regular_checkpoint_paths_are_refused_in_one_line(tmp_path, kind):
    """--resume /dev/null was HDF5's 'RuntimeError: Can't decrement id ref count'."""
    path = {"device": Path("/dev/null"), "fifo": tmp_path / "fifo", "directory": tmp_path / "d"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    for option in ("resume", "checkpoint"):
        with pytest.raises(CheckpointError, match="not a regular file") as info:
            if option == "resume":
                checkpoint.Checkpoint.resume(path, {})
            else:
                checkpoint.Checkpoint.create(path, {}, occ_block=OCC_BLOCK)
        assert info.value.option == option and " --" not in str(info.value)
    if kind != "directory":  # click refuses a directory itself
        for flag in ("--resume", "--checkpoint"):
            msg = cli_error(["run", str(WATER), flag, str(path)])
            assert "not a regular file" in msg and msg.endswith(f"({flag})"), msg
    assert path.exists() and not path.is_file()


def test_fingerprint_fields(water_checkpoint):
    with h5py.File(water_checkpoint[0], "r") as f:
        fp = json.loads(f.attrs["fingerprint"])
    assert set(fp) >= {
        "dfmp2_version",
        "geometry",
        "charge",
        "basis",
        "auxbasis",
        "scf_mode",
        "frozen_core",
        "precision",
        "device",
        "shapes",
    }
    assert fp["auxbasis"] == "cc-pvdz-ri" and fp["device"] == "cpu"
    assert checkpoint.FORMAT == "dfmp2-checkpoint"


# ------------------------------------------------------------------ UHF: both spins' B, three pair sets
OH = INPUTS / "open_shell" / "hydroxyl.xyz"
# OH (nocc 5 alpha, 4 beta) in blocks of 2: alpha 3 blocks (6 pairs), beta 2 (3), alpha x beta 6
UHF_SETS = {"pairs_aa": 6, "pairs_bb": 3, "pairs_ab": 6}
UHF_NPAIRS = sum(UHF_SETS.values())
UHF_DATASETS = sorted(
    ["B", "B_crc", "B_beta", "B_beta_crc", "scf/mo_coeff", "scf/mo_energy"]
    + [f"{g}/{n}" for g in UHF_SETS for n in ("crc", "done", "sums")]
)


@pytest.fixture(scope="module")
def uhf_uninterrupted():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run(OH, RunOptions(**BLOCKS))
    finally:
        torch.set_num_threads(old)


def same_uhf_bits(a, b):
    return (
        same_bits(a, b)
        and a.spin["s2"].hex() == b.spin["s2"].hex()
        and all(a.spin[k].hex() == b.spin[k].hex() for k in ("e_corr_aa", "e_corr_bb", "e_corr_ab"))
    )


# interrupted in each pair set: after 3 (in aa), 7 (in bb) and 11 (in ab) pairs
@pytest.mark.parametrize("fail_after,storage", [(3, "memory"), (7, "disk"), (11, "memory"), (11, "disk")])
def test_interrupted_uhf_run_resumes_to_the_same_bits(tmp_path, monkeypatch, uhf_uninterrupted, fail_after, storage):
    ref = uhf_uninterrupted
    ck = tmp_path / "oh.h5"
    count_pair_calls(monkeypatch, fail_after=fail_after)
    with pytest.raises(KeyboardInterrupt):
        run(OH, RunOptions(**BLOCKS, storage=storage, checkpoint=str(ck), scratch_dir=str(tmp_path)))
    with h5py.File(ck, "r") as f:
        done = {g: int(f[f"{g}/done"][...].sum()) for g in UHF_SETS if g in f}
        assert sum(done.values()) == fail_after and f.attrs["complete"] == 0
        assert f["B"].attrs["complete"] == 1 and f["B_beta"].attrs["complete"] == 1
        assert f["scf/mo_coeff"].shape == (2, 19, 19) and f["scf"].attrs["nocc_beta"] == 4
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    monkeypatch.setattr(integrals.HostEngine, "blocks", lambda *a, **k: pytest.fail("B is in the checkpoint"))
    calls = count_pair_calls(monkeypatch)
    other = "disk" if storage == "memory" else "memory"
    r = run(OH, RunOptions(**BLOCKS, storage=other, resume=str(ck)))
    assert len(calls) == UHF_NPAIRS - fail_after
    assert r.ran["storage"]["from_checkpoint"] == {"scf": True, "B": True, "pairs": fail_after}
    assert r.ran["scf"]["reference"] == "UHF" and r.ran["scf"]["engine"] == rhf.ENGINE
    assert same_uhf_bits(r, ref)
    with h5py.File(ck, "r") as f:
        assert f.attrs["complete"] == 1 and all(f[f"{g}/done"][...].all() for g in UHF_SETS)


def test_uhf_interrupt_in_the_beta_fit_keeps_alpha_and_the_scf(tmp_path, monkeypatch, uhf_uninterrupted):
    from dfmp2.df import outofcore

    orig, fits = outofcore.fit_blocks, []

    def second_fails(*a, **k):
        if fits:
            raise KeyboardInterrupt()
        fits.append(1)
        return orig(*a, **k)

    ck = tmp_path / "oh.h5"
    monkeypatch.setattr(outofcore, "fit_blocks", second_fails)
    with pytest.raises(KeyboardInterrupt):
        run(OH, RunOptions(**BLOCKS, storage="disk", checkpoint=str(ck)))
    monkeypatch.setattr(outofcore, "fit_blocks", orig)
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF is in the checkpoint"))
    r = run(OH, RunOptions(**BLOCKS, resume=str(ck)))
    assert r.ran["storage"]["from_checkpoint"] == {"scf": True, "B": False, "pairs": 0}
    assert same_uhf_bits(r, uhf_uninterrupted)


@pytest.fixture(scope="module")
def oh_checkpoint(tmp_path_factory):
    ck = tmp_path_factory.mktemp("ck") / "oh.h5"
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    plans = []
    try:
        first = run(OH, RunOptions(**BLOCKS, checkpoint=str(ck)), on_plan=plans.append)
    finally:
        torch.set_num_threads(old)
    first.plan = plans[0]
    return ck, first


def test_every_uhf_dataset_is_listed_for_the_flip_test(oh_checkpoint):
    with h5py.File(oh_checkpoint[0], "r") as f:
        names = []
        f.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        fp = json.loads(f.attrs["fingerprint"])
    assert sorted(names) == sorted(UHF_DATASETS + PYSCF_DATASETS)
    assert fp["reference"] == "UHF" and fp["shapes"]["nocc_beta"] == 4 and fp["shapes"]["nocc"] == 5


def test_complete_uhf_checkpoint_gives_the_result_again(oh_checkpoint, monkeypatch, tmp_path):
    ck, first = oh_checkpoint
    calls = count_pair_calls(monkeypatch)
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("no SCF on resume"))
    r = run(OH, RunOptions(**BLOCKS, resume=str(copy(ck, tmp_path / "c.h5"))))
    assert calls == [] and same_uhf_bits(r, first)


@pytest.mark.parametrize(
    "dataset,storage",
    [(d, "memory") for d in UHF_DATASETS] + [("B", "disk"), ("B_beta", "disk"), ("B_beta_crc", "disk")],
)
@pytest.mark.parametrize("where", [0.0, 0.5, 1.0])
def test_any_flipped_byte_of_a_uhf_checkpoint_is_refused(oh_checkpoint, tmp_path, monkeypatch, dataset, where, storage):
    ck = copy(oh_checkpoint[0], tmp_path / "c.h5")
    flip_byte(ck, dataset, where)
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("no SCF on resume"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("no SCF on resume"))
    msg = cli_error(["run", str(OH), "--resume", str(ck), "--storage", storage] + BLOCK_ARGS)
    assert "is corrupted" in msg and "remove the file" in msg, msg


@pytest.mark.parametrize(
    "obj,attr,value",
    [
        ("scf", "nocc_beta", lambda v: v + 1),
        ("scf", "s2", lambda v: v + 1e-12),
        ("scf", "engine", lambda v: "pyscf"),
        ("scf", "nocc", lambda v: v - 1),
        ("B_beta", "metric", lambda v: "eigh"),
        ("B_beta", "metric_dropped", lambda v: v + 1),
    ],
)
def test_changed_uhf_attributes_are_refused(oh_checkpoint, tmp_path, obj, attr, value):
    ck = copy(oh_checkpoint[0], tmp_path / "c.h5")
    with h5py.File(ck, "r+") as f:
        f[obj].attrs[attr] = value(f[obj].attrs[attr])
    msg = cli_error(["run", str(OH), "--resume", str(ck)] + BLOCK_ARGS)
    assert "is corrupted" in msg and "checksum" in msg, msg


def test_rhf_and_uhf_checkpoints_do_not_resume_each_other(water_checkpoint, tmp_path):
    ck = copy(water_checkpoint[0], tmp_path / "c.h5")
    msg = cli_error(["run", str(WATER), "--resume", str(ck), "--reference", "uhf"] + BLOCK_ARGS)
    assert "the reference is RHF in the checkpoint but UHF here" in msg, msg
    uhf_ck = tmp_path / "u.h5"
    assert (
        CliRunner()
        .invoke(main, ["run", str(WATER), "--reference", "uhf", "--checkpoint", str(uhf_ck), "-q"] + BLOCK_ARGS)
        .exit_code
        == 0
    )
    msg = cli_error(["run", str(WATER), "--resume", str(uhf_ck)] + BLOCK_ARGS)
    assert "the reference is UHF in the checkpoint but RHF here" in msg, msg


def test_uhf_checkpoint_estimate_covers_the_whole_file(oh_checkpoint):
    """checkpoint.size_mb with both spins (B's crc32s, SCFs and the three pair sets) is at least
    the finished file and not far above it."""
    ck, first = oh_checkpoint
    est = checkpoint.size_mb(b_mb=first.plan.b_mb, nbasis=19, nmo=19, nblocks=3, nblocks_beta=2) * 1e6
    size = ck.stat().st_size
    assert size <= est <= size + 2 * 64 * 1024, (size, est)


@pytest.mark.heavy
def test_killed_uhf_process_resumes_to_the_uninterrupted_energy(tmp_path, uhf_uninterrupted):
    """OH in a real process, SIGKILLed in the pair step (after 8 of its 15 pairs: into the beta set)."""
    ck = tmp_path / "oh.h5"
    proc = start_child(["--storage", "disk", "--checkpoint", str(ck), "-q"], tmp_path, path=OH)
    code, _err = kill_after_pairs(proc, 8, signal.SIGKILL)
    assert code == -signal.SIGKILL
    with h5py.File(ck, "r") as f:
        ndone = sum(int(f[f"{g}/done"][...].sum()) for g in UHF_SETS if g in f)
    assert 7 <= ndone < UHF_NPAIRS
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["run", str(OH), "--resume", str(ck), "--json", str(out), "-q"] + BLOCK_ARGS)
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    e, ref = d["energies"], uhf_uninterrupted
    assert (e["e_corr_os"], e["e_corr_ss"], e["e_hf"]) == (ref.e_os, ref.e_ss, ref.e_hf)
    assert d["ran"]["storage"]["from_checkpoint"]["pairs"] == ndone


@pytest.mark.parametrize("which", ["rhf", "uhf"])
def test_pyscf_restarts_from_our_checkpoint(water_checkpoint, oh_checkpoint, tmp_path, which):
    """PySCF reads our checkpoint as its own chkfile: ``lib.chkfile.load_mol`` gives the
    molecule, ``scf.chkfile.load(path, 'scf')`` the orbitals, and a DF-SCF started from them
    (``mf.from_chk``) is converged at once, at our E(HF) (1e-9 Eh); the file still resumes."""
    from pyscf import lib
    from pyscf import scf as pyscf_scf

    ck, first = water_checkpoint if which == "rhf" else oh_checkpoint
    ck = copy(ck, tmp_path / "c.h5")
    mol = lib.chkfile.load_mol(str(ck))
    saved = pyscf_scf.chkfile.load(str(ck), "scf")
    assert abs(saved["e_tot"] - first.e_hf) < 1e-12 and saved["mo_occ"].sum() == mol.nelectron
    mf = (pyscf_scf.UHF if which == "uhf" else pyscf_scf.RHF)(mol).density_fit(auxbasis=first.jk_auxbasis)
    mf.conv_tol, mf.verbose = 1e-12, 0
    mf.kernel(dm0=mf.from_chk(str(ck)))
    assert mf.converged and mf.cycles <= 3 and abs(mf.e_tot - first.e_hf) < 1e-9
    again = run(WATER if which == "rhf" else OH, RunOptions(**BLOCKS, resume=str(ck)))
    assert same_bits(again, first)
