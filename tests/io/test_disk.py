"""Disks that fill up, and files written where the user did not say.

* A write the disk refuses while the run goes on (ENOSPC on a small tmpfs, EFBIG under a file-size
  rlimit) is one ``error:`` line and exit 2, in a real process (a failed HDF5 close used to
  segfault the interpreter at exit, rc 139), and what the run created is removed.
* The disk check before the run counts everything a checkpoint holds, not B alone.
* PySCF's own files (its DF-SCF tensor, its SCF chkfile) go under ``--scratch``, not ``$TMPDIR``,
  honour ``--memory``, and are removed: a run with ``TMPDIR`` pointed at an empty directory
  leaves it empty, and leaves the scratch directory as it found it.

The tmpfs tests mount a small file system (root, as on these machines and CI); where mounting is
not permitted they are skipped with the reason, and the file-size-rlimit tests still run.
"""

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from tmpfs import tmpfs

from dfmp2.cli.main import main
from dfmp2.interfaces import api
from dfmp2.io import checkpoint, molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.scf import pyscf_scf

ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs" / "water.xyz"
HYDROXYL = ROOT / "inputs" / "open_shell" / "hydroxyl.xyz"

# dfmp2's CLI in a child process whose disk check sees a huge free disk: the check passes, and the
# disk fills while the run goes on (another process filled it, say), which is what is tested here
PATCHED_CLI = (
    "import collections, shutil, sys; "
    "shutil.disk_usage = lambda p: collections.namedtuple('u', 'total used free')(10**12, 0, 10**12); "
    "from dfmp2.cli.main import main; sys.argv[0] = 'dfmp2'; main()"
)


def run_cli(args, *, env=None, preexec_fn=None, patched=True, timeout=180):
    """``dfmp2 args`` in a child process: (returncode, stderr lines)."""
    cmd = [sys.executable, "-c", PATCHED_CLI] if patched else [sys.executable, "-m", "dfmp2.cli.main"]
    p = subprocess.run(
        cmd + [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec_fn,
        cwd=ROOT,
    )
    return p.returncode, [ln for ln in p.stderr.splitlines() if ln.strip()]


def assert_one_error(rc, err, *fragments):
    assert rc == 2, (rc, err)  # 139 was the segfault of a failed HDF5 close
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert "Traceback" not in "\n".join(err)
    for f in fragments:
        assert f in err[0], (f, err[0])


# ------------------------------------------------------------------ 5. a disk that fills up
@pytest.mark.heavy
@pytest.mark.parametrize("where", ["checkpoint", "scratch"])
def test_a_disk_that_fills_during_the_run_is_one_line_and_nothing_stays(tmp_path, where):
    with tmpfs(tmp_path, 40) as disk:  # water's B alone is 64 kB
        extra = ["--checkpoint", disk / "ck.h5"] if where == "checkpoint" else ["--storage", "disk", "--scratch", disk]
        rc, err = run_cli(["run", WATER, "-q", *extra])
        assert_one_error(
            rc,
            err,
            "No space left on device",
            f"cannot write the {where}",
            "(--checkpoint)" if where == "checkpoint" else "(--scratch)",
        )
        assert list(disk.iterdir()) == []


@pytest.mark.heavy
def test_a_full_disk_for_the_json_is_one_line_and_nothing_stays(tmp_path):
    with tmpfs(tmp_path, 16) as disk:
        filler = disk / "filler"
        with contextlib.suppress(OSError), open(filler, "wb") as f:
            f.write(b"\0" * (64 << 10))  # fills it (the rest of what does not fit is refused)
        rc, err = run_cli(["run", WATER, "-q", "--json", disk / "out.json"])
        assert_one_error(rc, err, "No space left on device", "out.json")
        assert [p.name for p in disk.iterdir()] == ["filler"]


def _file_size_limit(nbytes: int):
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # write() fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


@pytest.mark.heavy
@pytest.mark.parametrize("limit", [40_000, 100])  # mid-run; at the file's creation
def test_a_file_size_limit_on_the_checkpoint_is_one_line_and_removes_it(tmp_path, limit):
    """No mount needed: ``ulimit -f`` refuses the checkpoint's writes past ``limit`` bytes (EFBIG)."""
    ck = tmp_path / "ck.h5"
    rc, err = run_cli(["run", WATER, "-q", "--checkpoint", ck], preexec_fn=_file_size_limit(limit))
    assert_one_error(rc, err, "File too large", "cannot write the checkpoint", "(--checkpoint)")
    assert not ck.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.heavy
def test_a_file_size_limit_on_scratch_b_is_one_line_and_removes_it(tmp_path):
    rc, err = run_cli(
        ["run", WATER, "-q", "--storage", "disk", "--scratch", tmp_path], preexec_fn=_file_size_limit(40_000)
    )
    assert_one_error(rc, err, "File too large", "cannot write the scratch file", "(--scratch)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("extra", [{}, {"precision": "fp32"}, {"occ_block_max": 1}])
def test_the_checkpoint_estimate_covers_the_whole_file(tmp_path, extra):
    """What the disk check counts (checkpoint.size_mb) is at least the finished file, and not
    far above it; B alone (what it counted before) is 27 % short for water."""
    ck, plans = tmp_path / "ck.h5", []
    api.run(WATER, RunOptions(checkpoint=str(ck), **extra), on_plan=plans.append)
    (plan,) = plans
    nocc, nbasis = 5, 24
    est = checkpoint.size_mb(b_mb=plan.b_mb, nbasis=nbasis, nmo=nbasis, nblocks=-(-nocc // plan.occ_block)) * 1e6
    size = ck.stat().st_size
    assert plan.b_mb * 1e6 < size <= est <= size + 64 * 1024, (plan.b_mb * 1e6, size, est)


def test_the_disk_check_refuses_a_checkpoint_that_b_alone_would_fit(tmp_path, no_scf):
    """72 kB of disk: B (64 kB with the 2 % margin) fits, the whole checkpoint (~82 kB) does not:
    refused before the SCF, where it used to fail with ENOSPC in the middle of the run."""
    with tmpfs(tmp_path, 72) as disk:
        res = CliRunner().invoke(main, ["run", str(WATER), "-q", "--checkpoint", str(disk / "ck.h5")])
        assert res.exit_code == 2, res.output
        assert "of disk" in res.stderr and "checkpoint" in res.stderr and "(--checkpoint)" in res.stderr
        assert list(disk.iterdir()) == []


# ------------------------------------------------------------------ 6. PySCF's files
@pytest.mark.heavy
@pytest.mark.parametrize(
    "mol,args,df_tensor",
    [
        (WATER, ["--scf", "pyscf-df", "--memory", "0.25MB"], "disk"),  # the tensor (0.28 MB) over 0.9 x 0.25 MB
        (WATER, ["--scf", "pyscf-df"], "memory"),
        (WATER, ["--scf", "exact"], None),
        (WATER, ["--storage", "disk"], None),  # our DF-RHF, B on disk
        (HYDROXYL, [], None),  # UHF: our DF-UHF
        (HYDROXYL, ["--scf", "pyscf-df"], "memory"),  # UHF: PySCF's DF-UHF
    ],
)
def test_no_file_outside_the_scratch_directory(tmp_path, mol, args, df_tensor):
    """TMPDIR points at an empty directory, --scratch at another: both are empty after the run,
    and the result records where PySCF's DF tensor was."""
    tmp, scratch, out = tmp_path / "tmpdir", tmp_path / "scratch", tmp_path / "out.json"
    tmp.mkdir()
    scratch.mkdir()
    rc, err = run_cli(
        ["run", mol, "-q", "--scratch", scratch, "--json", out, *args], env={"TMPDIR": str(tmp)}, patched=False
    )
    assert rc == 0, err
    assert list(tmp.iterdir()) == [] and list(scratch.iterdir()) == []
    assert json.loads(out.read_text())["ran"]["scf"]["df_tensor"] == df_tensor


@pytest.mark.heavy
def test_pyscf_writes_its_df_tensor_under_scratch_with_the_memory_limit(tmp_path, monkeypatch):
    """In process: PySCF's DF build sees --memory as max_memory, and its tensor file lies in a
    private directory under --scratch while it exists."""
    from pyscf.df import df as pyscf_df
    from pyscf.df import outcore

    seen = {}
    build, write = pyscf_df.DF.build, outcore.cholesky_eri_b

    def spy_build(self):
        seen["max_memory"] = self.max_memory
        return build(self)

    def spy_write(mol, erifile, *a, **k):
        seen["file"] = Path(erifile)
        return write(mol, erifile, *a, **k)

    monkeypatch.setattr(pyscf_df.DF, "build", spy_build)
    monkeypatch.setattr(outcore, "cholesky_eri_b", spy_write)
    r = api.run(WATER, RunOptions(scf_mode="pyscf-df", memory_mb=0.25, scratch_dir=str(tmp_path)))
    assert seen["max_memory"] == pytest.approx(0.25)
    assert seen["file"].parent.parent == tmp_path and seen["file"].parent.name.startswith("dfmp2-pyscf-")
    assert r.ran["scf"]["df_tensor"] == "disk" and list(tmp_path.iterdir()) == []


def test_pyscf_df_tensor_on_disk_is_in_the_disk_check(tmp_path, no_scf):
    """A DF tensor that goes to disk is counted before the SCF: a 64 kB scratch disk is too
    small for water's 0.28 MB tensor (0.25 MB of memory: 24 % above PySCF's in-memory share)."""
    assert pyscf_scf.pyscf_df_mb(molecule.build_molecule(read_xyz(WATER))) > 0.2
    with tmpfs(tmp_path, 64) as disk:
        res = CliRunner().invoke(
            main, ["run", str(WATER), "-q", "--scf", "pyscf-df", "--memory", "0.25MB", "--scratch", str(disk)]
        )
        assert res.exit_code == 2 and "of disk" in res.stderr and "(--scratch)" in res.stderr, res.output
        assert list(disk.iterdir()) == []


# ------------------------------------------------------------------ SIGTERM inside a long C call
STUCK_IN_C = """
import sqlite3, sys
from pyscf.scf import hf
from dfmp2.cli import main as cli
from dfmp2.cli import runtime as cli_runtime
cli_runtime.TERMINATE_GRACE_S = 2.0
def stuck(self, *a, **k):      # one long call into C that releases the GIL (as libcint and BLAS do)
    print('in C', file=sys.stderr, flush=True)
    sqlite3.connect(':memory:').execute(
        'WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 10000000000) '
        'SELECT count(*) FROM c').fetchall()
hf.SCF.kernel = stuck
sys.argv[0] = 'dfmp2'
cli.main()
"""


@pytest.mark.heavy
@pytest.mark.parametrize(
    "command, signum", [("run", signal.SIGTERM), ("run", signal.SIGINT), ("gradient", signal.SIGTERM)]
)
def test_a_signal_during_a_long_c_call_ends_the_run_promptly_and_cleans_up(tmp_path, command, signum):
    """PySCF's SCF stuck in one C call that would run for minutes (a run once took 300 s to honour
    SIGTERM): the watchdog ends it 2 s (its grace, patched from 10) after the signal, with one
    error line, exit 128 + signum, and PySCF's scratch directory removed (``dfmp2 gradient``
    runs under the same watchdog)."""
    import time

    # SIGINT at its default in the child: a suite started as a background job inherits it ignored,
    # and the program keeps a user's ignored SIGINT
    p = subprocess.Popen(
        [sys.executable, "-c", STUCK_IN_C, command, str(WATER), "-q", "--scf", "pyscf-df", "--scratch", str(tmp_path)],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert p.stderr.readline().strip() == "in C"
        assert [d.name[:12] for d in tmp_path.iterdir()] == ["dfmp2-pyscf-"]
        time.sleep(1.0)  # into the query (a signal before it would be handled in Python at once)
        t0 = time.perf_counter()
        p.send_signal(signum)
        rc = p.wait(timeout=60)
        waited = time.perf_counter() - t0
    finally:
        p.kill()
    err = [ln for ln in p.stderr.read().splitlines() if ln.strip()]
    assert rc == (130 if signum == signal.SIGINT else 128 + signum) and 1.5 < waited < 30, (rc, waited, err)
    assert len(err) == 1 and err[0].startswith("error: interrupted"), err
    assert list(tmp_path.iterdir()) == []
