"""Output paths (dfmp2.io.outputs) and the commands that write files: a path that cannot be written
is one ``error:`` line and exit 2 before any heavy work; the JSON write never replaces a device,
the input or the checkpoint, keeps the umask, and leaves nothing half-written; ``bench --name``
stays inside ``--out``; file names with rich markup print as they are.

The tests run as root, where permission bits stop nothing: the unwritable places used here are a
missing directory, a regular file used as a directory, a directory used as a file, /proc (where
not even root creates files) and a private character device that behaves as /dev/full.
"""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.errors import InputError, SCFNotConvergedError
from dfmp2.interfaces import api
from dfmp2.io import outputs
from dfmp2.options import RunOptions
from dfmp2.scf import driver, pyscf_scf
from dfmp2.workflows import compare as compare_mod
from dfmp2.workflows import regress

ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs" / "water.xyz"
PROC_OK = os.path.isdir("/proc/self")


def one_error(res, *fragments):
    """Exit 2, the last non-empty line the only ``error:`` line, no traceback; returns it."""
    assert res.exit_code == 2, (res.exit_code, res.output)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], res.output
    assert "Traceback" not in res.output and res.exc_info[0] is SystemExit, res.exc_info
    for f in fragments:
        assert f in errors[0], (f, errors[0])
    return errors[0]


def usage_error(res, fragment):
    """Refused by click's own path check (dir_okay / file_okay) before the command runs."""
    assert res.exit_code == 2 and fragment in res.output and "Traceback" not in res.output, res.output


@pytest.fixture
def no_heavy_work(monkeypatch):
    """Any SCF, regression case, device comparison or benchmark fails the test."""

    def fail(*a, **k):
        pytest.fail("heavy work started before the output path was checked")

    monkeypatch.setattr(pyscf_scf, "run_rhf", fail)
    monkeypatch.setattr(pyscf_scf, "run_uhf", fail)
    monkeypatch.setattr(driver, "run_scf", fail)
    monkeypatch.setattr(regress, "run_case", fail)
    monkeypatch.setattr(compare_mod, "run_once", fail)
    monkeypatch.setattr(compare_mod, "run_synthetic", fail)
    import dfmp2.benchmarks.run as bench_run

    monkeypatch.setattr(bench_run, "run_bench", fail)


def bad_places(tmp_path):
    """(label, path of a file to write, fragment of the error) that fail even for root."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "a_dir").mkdir()
    places = [
        ("missing directory", tmp_path / "nodir" / "out.json", "does not exist"),
        ("parent is a regular file", a_file / "out.json", "Not a directory"),
        ("path is a directory", tmp_path / "a_dir", "is a directory"),
    ]
    if PROC_OK:
        places.append(("read-only directory (/proc)", Path("/proc/dfmp2-out.json"), "cannot create files"))
    return places


def snapshot(tmp_path):
    return sorted((str(p.relative_to(tmp_path)), p.is_dir() or p.read_bytes()) for p in tmp_path.rglob("*"))


# ------------------------------------------------------------------ 1. checked before the work
def test_check_output_file_refuses_unwritable_places(tmp_path):
    for _label, path, fragment in bad_places(tmp_path):
        with pytest.raises(InputError, match=fragment):
            outputs.check_output_file(path, "--json")
    ok = tmp_path / "new.json"
    assert outputs.check_output_file(ok, "--json") == ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_dir", "a_file"]  # the probe is gone


def test_run_json_unwritable_fails_before_scf(tmp_path, no_heavy_work):
    for label, path, fragment in bad_places(tmp_path):
        before = snapshot(tmp_path)
        res = CliRunner().invoke(main, ["run", str(WATER), "--json", str(path)])
        if label == "path is a directory":  # click's own dir_okay=False check is first
            usage_error(res, "is a directory")
        else:
            one_error(res, "--json", fragment)
        assert snapshot(tmp_path) == before, label


def test_regress_and_compare_json_unwritable_fail_before_any_case(tmp_path, no_heavy_work):
    bad = tmp_path / "nodir" / "r.json"
    one_error(
        CliRunner().invoke(main, ["regress", "water|cc-pvdz|cc-pvdz-ri|df|fc", "--json", str(bad)]),
        "--json",
        "does not exist",
    )  # 2 (bad input), not 1 (a regression failed)
    one_error(
        CliRunner().invoke(main, ["compare", str(WATER), "--devices", "cpu", "--json", str(bad)]),
        "--json",
        "does not exist",
    )
    one_error(
        CliRunner().invoke(main, ["compare", "--synthetic", "2,3,4", "--devices", "cpu", "--json", str(bad)]),
        "does not exist",
    )
    assert not (tmp_path / "nodir").exists()


def test_bench_out_unwritable_fails_before_timing(tmp_path, no_heavy_work):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    usage_error(CliRunner().invoke(main, ["bench", "--out", str(a_file), "--waters", "none"]), "is a file")
    one_error(
        CliRunner().invoke(main, ["bench", "--out", str(a_file / "sub"), "--waters", "none"]), "is not a directory"
    )
    (tmp_path / "out" / "b.json").mkdir(parents=True)  # NAME.json taken by a directory
    one_error(
        CliRunner().invoke(main, ["bench", "--out", str(tmp_path / "out"), "--name", "b", "--waters", "none"]),
        "is a directory",
    )
    if PROC_OK:
        one_error(
            CliRunner().invoke(main, ["bench", "--out", "/proc/dfmp2-bench", "--waters", "none"]), "cannot create files"
        )
    assert a_file.read_text() == "x" and not (tmp_path / "bench-results").exists()


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "/tmp/x"])
def test_bench_name_cannot_leave_out_dir(tmp_path, no_heavy_work, name):
    out = tmp_path / "out"
    msg = one_error(
        CliRunner().invoke(main, ["bench", "--out", str(out), "--name", name, "--waters", "none"]), "--name"
    )
    assert "without '/' or '..'" in msg
    assert list(tmp_path.iterdir()) == []


def test_scratch_unwritable_fails_before_scf(tmp_path, no_heavy_work):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    usage_error(CliRunner().invoke(main, ["run", str(WATER), "--scratch", str(a_file)]), "is a file")
    with pytest.raises(InputError, match=r"--scratch .* is not a directory"):
        outputs.check_output_dir(a_file, "--scratch")
    scratches = [(tmp_path / "nodir", "does not exist"), (a_file / "sub", "does not exist")]
    if PROC_OK:
        scratches.append((Path("/proc"), "cannot create files"))
    for scratch, fragment in scratches:
        for storage in ("disk", "memory"):
            one_error(
                CliRunner().invoke(main, ["run", str(WATER), "--scratch", str(scratch), "--storage", storage]),
                "--scratch",
                fragment,
            )


def test_check_disk_adds_up_one_file_system_with_a_margin(tmp_path, monkeypatch):
    import shutil

    (tmp_path / "ck").mkdir()
    free_mb = {"now": 100.0}
    monkeypatch.setattr(
        shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9, int(free_mb["now"] * 1e6))
    )
    outputs.check_disk([(tmp_path, 49.0, "scratch_dir"), (tmp_path / "ck", 49.0, "checkpoint")])
    with pytest.raises(InputError) as info:  # 99 MB with 2 % to spare do not fit in 100 MB
        outputs.check_disk([(tmp_path, 50.0, "scratch_dir"), (tmp_path / "ck", 49.0, "checkpoint")])
    msg = str(info.value)
    assert (
        msg.startswith(
            f"this run needs 101 MB of disk in {tmp_path} (checkpoint and scratch: 99 MB "
            "and a 2% margin) but only 100 MB are free"
        )
        and " --" not in msg
    )
    assert info.value.option == "scratch_dir" and msg.endswith("or allow more memory (B stays off disk)")
    with pytest.raises(InputError) as info:
        outputs.check_disk([(tmp_path / "ck", 99.0, "checkpoint")])
    # a checkpoint holds B however much memory there is: no advice to raise the memory limit
    assert info.value.option == "checkpoint" and "(checkpoint: 99 MB" in str(info.value)
    assert "memory" not in str(info.value)
    with pytest.raises(InputError, match=r"scratch directory: directory .* does not exist") as info:
        outputs.check_disk([(tmp_path / "nodir", 1.0, "scratch_dir")])
    assert info.value.option == "scratch_dir"


# ------------------------------------------------------------------ 2. what the write replaces
def test_json_refuses_the_input_and_the_checkpoint(tmp_path, no_heavy_work):
    xyz = tmp_path / "w.xyz"
    xyz.write_text(WATER.read_text())
    one_error(CliRunner().invoke(main, ["run", str(xyz), "--json", str(xyz)]), "is the input")
    link = tmp_path / "link.json"
    link.symlink_to(xyz)  # the same file under another name
    one_error(CliRunner().invoke(main, ["run", str(xyz), "--json", str(link)]), "is the input")
    ck = tmp_path / "ck.h5"
    one_error(
        CliRunner().invoke(main, ["run", str(xyz), "--checkpoint", str(ck), "--json", str(ck)]), "is the checkpoint"
    )
    assert not ck.exists()
    ck.write_bytes(b"stands for a checkpoint")
    one_error(
        CliRunner().invoke(main, ["run", str(xyz), "--resume", str(ck), "--json", str(tmp_path / "." / "ck.h5")]),
        "is the checkpoint",
    )
    assert xyz.read_text() == WATER.read_text() and ck.read_bytes() == b"stands for a checkpoint"


@pytest.mark.parametrize("flag", ["--json", "--qcschema"])
def test_outputs_refuse_a_rank_s_checkpoint_file(tmp_path, no_heavy_work, flag):
    """A run over ranks keeps rank r's checkpoint in '<checkpoint>.rank<r>': an output of that name
    (from another directory spelling too) would replace it."""
    rank1 = tmp_path / "ck.h5.rank1"
    rank1.write_bytes(b"stands for rank 1's file")
    for ck_flag in ("--checkpoint", "--resume"):
        for out in (rank1, Path(os.path.relpath(rank1)), tmp_path / "sub" / ".." / "ck.h5.rank12"):
            (tmp_path / "sub").mkdir(exist_ok=True)
            r = CliRunner().invoke(main, ["run", str(WATER), ck_flag, str(tmp_path / "ck.h5"), flag, str(out)])
            one_error(r, "file of the checkpoint", "rank 1" if out.name.endswith("1") else "rank 12")
    assert rank1.read_bytes() == b"stands for rank 1's file"
    assert outputs._rank_file_of(tmp_path / "ck.h5.rank1x", tmp_path / "ck.h5") is None
    assert outputs._rank_file_of(tmp_path / "other" / "ck.h5.rank1", tmp_path / "ck.h5") is None


def test_write_into_a_fifo_keeps_the_fifo(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    # the reading end is open before the write (a reader thread could open it after the writer,
    # which then meets a FIFO nobody reads: ENXIO, the refusal tested elsewhere)
    rfd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        outputs.check_output_file(fifo, "--json")
        outputs.write_text(fifo, '{"a": 1}\n')
        got = [os.read(rfd, 1024).decode()]
    finally:
        os.close(rfd)
    assert got == ['{"a": 1}\n'] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_device_full_is_one_error_and_stays_a_device(tmp_path):
    """A private twin of /dev/full (char 1,7): the error is clean and the node is not replaced."""
    full = tmp_path / "full"
    try:
        os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")
    try:
        open(full, "rb").close()
    except OSError as e:
        pytest.skip(f"device nodes cannot be opened here: {e}")
    with pytest.raises(InputError, match="No space left on device"):
        outputs.write_text(full, "{}\n")
    assert stat.S_ISCHR(os.stat(full).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_dev_null_is_written_into_not_replaced():
    """Run only against the real /dev/null because write_text opens a non-regular file in place
    (the fifo test above checks that with a node of our own first)."""
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    outputs.check_output_file("/dev/null", "--json")
    outputs.write_text("/dev/null", "{}\n")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_gets_the_umask_mode(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        outputs.write_text(tmp_path / "o.json", "{}\n")
        existing = tmp_path / "e.json"
        existing.write_text("old")
        outputs.write_text(existing, "{}\n")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "o.json").st_mode) == mode
    assert stat.S_IMODE(os.stat(existing).st_mode) == mode and existing.read_text() == "{}\n"


def test_symlink_keeps_the_link_and_replaces_its_file(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    outputs.write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    p = tmp_path / "o.json"
    p.write_text("old")

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(InputError, match=f"cannot write {p}: No space left on device"):
        outputs.write_text(p, "new")
    assert p.read_text() == "old" and [x.name for x in tmp_path.iterdir()] == ["o.json"]


# ------------------------------------------------------------------ 4. a failed run's checkpoint
def test_checkpoint_of_a_run_that_failed_before_scf_is_removed(tmp_path, monkeypatch):
    ck = tmp_path / "ck.h5"

    def not_converged(*a, **k):
        raise SCFNotConvergedError("RHF did not converge (test)")

    monkeypatch.setattr(pyscf_scf, "run_rhf", not_converged)
    monkeypatch.setattr(driver, "run_scf", not_converged)
    args = ["run", str(WATER), "--checkpoint", str(ck)]
    for _ in range(2):  # the same command again: the same error, not "already exists"
        one_error(CliRunner().invoke(main, args), "did not converge")
        assert not ck.exists()

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pyscf_scf, "run_rhf", interrupted)
    monkeypatch.setattr(driver, "run_scf", interrupted)
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 130 and res.output.strip().splitlines()[-1] == "error: interrupted", res.output
    assert not ck.exists()


@pytest.mark.parametrize(
    "exc,kept",
    [(InputError("refused (test)"), False), (KeyboardInterrupt(), True), (RuntimeError("device lost (test)"), True)],
)
def test_checkpoint_after_scf_kept_unless_a_refusal(tmp_path, monkeypatch, exc, kept):
    from dfmp2.drivers import energy as energy_driver

    ck = tmp_path / "ck.h5"

    def fail(*a, **k):
        raise exc

    monkeypatch.setattr(energy_driver, "mp2_stage", fail)
    with pytest.raises(type(exc)):
        api.run(WATER, RunOptions(checkpoint=str(ck)))
    assert ck.exists() == kept


# ------------------------------------------------------------------ 6. rich markup in user text
def test_file_name_with_markup_end_to_end(tmp_path):
    (tmp_path / "mol[").mkdir()
    (tmp_path / "out[").mkdir()
    xyz = tmp_path / "mol[/x].xyz"  # the path as typed: markup '[/x]' inside it
    xyz.write_text(WATER.read_text())
    out = tmp_path / "out[/y].json"
    res = CliRunner().invoke(main, ["run", str(xyz), "--json", str(out)])
    assert res.exit_code == 0, res.output
    flat = res.output.replace("\n", "")
    assert "mol[/x].xyz" in flat and f"wrote {out}" in flat
    assert json.loads(out.read_text())["molecule"] == str(xyz)


def test_regress_and_compare_tables_print_markup_as_text():
    from rich.console import Console

    from dfmp2.workflows.compare import DeviceRun, compare_runs
    from dfmp2.workflows.compare import render as compare_render
    from dfmp2.workflows.regress import CaseResult
    from dfmp2.workflows.regress import render as regress_render

    con = Console(width=300, record=True)
    cr = CaseResult(
        key="[/k]",
        molecule="[bold]m[/x]",
        scf_mode="df",
        frozen_core=False,
        nbasis=1,
        naux=1,
        precision="fp64",
        tolerance=1e-9,
        reference={"e_corr": -0.1},
        error="file [/x].xyz: bad",
    )
    regress_render([cr], con, "cpu", "fp64", 1e-9)
    runs = [
        DeviceRun("cpu", energies={"e_corr": -0.1}, hex=[{"e_corr": "0x1"}], seconds=[0.1]),
        DeviceRun("cuda", status="not run", reason="no [/gpu] here"),
    ]
    compare_render(runs, compare_runs(runs, 1e-10), "mol[/x].xyz cc-pvdz", con)
    text = con.export_text()
    for s in ("[bold]m[/x]", "file [/x].xyz: bad", "mol[/x].xyz", "no [/gpu] here"):
        assert s in text, s


ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs" / "water.xyz"


def _dfmp2(args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "dfmp2.cli.main", *args], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, **kw
    )


@pytest.mark.heavy
def test_full_stdout_keeps_the_json_and_is_one_error(tmp_path):
    """`dfmp2 run ... --json x.json >/dev/full` was a rich traceback, exit 1, and no x.json
    now the files are written before the table, the full stdout is one line."""
    out = tmp_path / "x.json"
    with open("/dev/full", "w") as full:
        p = _dfmp2(["run", str(WATER), "--json", str(out)], stdout=full)
        _, err = p.communicate(timeout=120)
    assert p.returncode == 2, err
    lines = err.strip().splitlines()
    assert lines[-1] == f"error: cannot write to standard output (No space left on device); {out} written"
    assert "Traceback" not in err and "Exception ignored" not in err
    assert json.loads(out.read_text())["energies"]["e_mp2"] < 0


@pytest.mark.heavy
def test_closed_pipe_ends_quietly_with_the_json_written(tmp_path):
    """`dfmp2 run ... | head -1`: a reader gone before the table ends the printing quietly; the run
    exits 0 (it finished and wrote its files)."""
    out = tmp_path / "x.json"
    p = _dfmp2(["run", str(WATER), "--json", str(out), "-q"], stdout=subprocess.PIPE)
    p.stdout.close()  # no reader left: the first write is EPIPE
    err = p.stderr.read()
    p.wait(timeout=120)
    assert p.returncode == 0, err
    assert err == "" and json.loads(out.read_text())["energies"]["e_mp2"] < 0
