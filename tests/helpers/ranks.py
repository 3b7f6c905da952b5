"""Starting dfmp2 over several processes in the tests (gloo on CPU): the environment of a rank,
torchrun, and ranks started by hand as Slurm or an MPI launcher would (RANK, WORLD_SIZE, ... set
per process), so each rank's exit status and stderr are seen and no torchrun agent ends the
survivors for them. Used by tests/system/test_distributed*.py."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 90  # seconds each process may take


def env(tmp_path, **extra) -> dict:
    """The test's environment for a dfmp2 process: this checkout first on PYTHONPATH, one thread,
    a temporary directory of the test's own, and no launcher variable or fault hook but ``extra``'s."""
    out = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TMPDIR=str(tmp_path / "tmp"), **extra)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DFMP2_TEST_FAULT"):
        if var not in extra:
            out.pop(var, None)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return out


def torchrun(tmp_path, ranks: int, args: list, command: str, timeout: float = LIMIT_S * 2, **extra):
    """``dfmp2 <command> <args>`` in one process (``ranks`` 1) or under torchrun, in ``tmp_path``,
    with ``extra`` in its environment: (the completed process, its wall seconds)."""
    cmd = [sys.executable, "-m", "dfmp2", command, *args]
    if ranks > 1:
        cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dfmp2"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, env=env(tmp_path, **extra), capture_output=True, text=True, timeout=timeout, cwd=tmp_path)
    return p, time.perf_counter() - t0


def launch(tmp_path, argsets, command="run", **extra):
    """Ranks started by hand, rank r running ``dfmp2 <command> <argsets[r]>``:
    [(returncode, stderr, seconds)] per rank."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    n, procs, t0 = len(argsets), [], time.perf_counter()
    for r, args in enumerate(argsets):
        rank_env = env(
            tmp_path,
            RANK=str(r),
            WORLD_SIZE=str(n),
            LOCAL_RANK=str(r),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            **{"DFMP2_DIST_TIMEOUT_S": "40", **extra},
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "dfmp2", command, *args],
                env=rank_env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    out = []
    try:
        for p in procs:
            _, err = p.communicate(timeout=LIMIT_S)
            out.append((p.returncode, err, time.perf_counter() - t0))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def error_lines(results) -> list:
    """The ``error:`` lines of every rank's stderr in ``launch``'s results."""
    return [ln for _, err, _ in results for ln in err.splitlines() if ln.startswith("error:")]
