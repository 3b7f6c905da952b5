"""A small tmpfs for the full-disk tests (tests/io/test_disk.py, tests/system/test_fuzz_cli.py;
imported as ``from tmpfs import tmpfs``)."""

import contextlib
import subprocess
import uuid
from pathlib import Path

import pytest


@contextlib.contextmanager
def tmpfs(parent: Path, size_kb: int):
    """A tmpfs of ``size_kb`` kB mounted at a new directory under ``parent`` (skip if not allowed)."""
    d = parent / f"tmpfs-{uuid.uuid4().hex[:8]}"
    d.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(d)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(
            f"cannot mount a small tmpfs here ({r.stderr.strip() or 'mount failed'}): "
            "the file-size-rlimit tests cover a refused write instead"
        )
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)
        d.rmdir()
