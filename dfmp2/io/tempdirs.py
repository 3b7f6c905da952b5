"""The run's temporary directories (our scratch files, PySCF's files), known to the process.

Each is removed by the ``finally`` of the code that made it (``outofcore.Scratch.close``,
``scf.pyscf_scratch``). This registry is for the one case where that ``finally`` cannot run in
time: a signal (SIGTERM, SIGHUP, Ctrl-C) while the main thread is inside one long call into C
that holds no Python frame to raise in (PySCF's DF build, a BLAS call, an HDF5 write: a run once
took minutes to honour SIGTERM). The CLI's watchdog (``cli_runtime.terminate_raises``) then removes what
is registered here before it ends the process.
"""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

_live: set[Path] = set()
_lock = threading.Lock()


def register(path) -> None:
    """``path``, a directory this run made and removes when done, is live until ``unregister``."""
    with _lock:
        _live.add(Path(path))


def unregister(path) -> None:
    with _lock:
        _live.discard(Path(path))


def remove_all() -> None:
    """Remove every live directory now (the watchdog, before it ends the process)."""
    with _lock:
        paths = list(_live)
        _live.clear()
    for p in paths:
        shutil.rmtree(p, ignore_errors=True)
