"""Compile a CPU kernel's C source once, with the system's C compiler, into a per-user cache.

Why this and not a build step at install: the same tree runs installed (pip install -e), from a
plain checkout (PYTHONPATH, helpers' worktrees, the GPU machine) and under several Python versions;
one plain C shared library (no Python C API, loaded with ctypes) compiled on first use serves them
all, as Triton builds its launchers. The library is named by a hash of the source, the flags and
the compiler's version, so an edited source or another compiler builds anew and two processes
(torchrun ranks) that build at once both end with the same complete file (atomic rename).

Where: ``$XDG_CACHE_HOME/dfmp2/kernels/`` (or ``~/.cache/dfmp2/kernels/``); when that cannot be
written, a private temporary directory of this process, removed once the library is loaded
(recorded: ``cached`` False); a library already in a read-only cache is used as it is. The compiler:
``$CC`` if set, else ``cc``, else ``gcc``. Nothing is read from the environment at import time.

A kernel that cannot be built raises KernelBuildError with the compiler's own first error line;
nothing is switched to another implementation here (linalg decides what the user is told).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
# -O3 vectorises the epilogue's loops; no -march=native: a cache on a home directory shared by
# several kinds of machine stays valid. Never -ffast-math: it would reorder the energy sums.
CFLAGS = ("-O3", "-std=c99", "-fPIC", "-shared")
COMPILE_TIMEOUT_S = 120


class KernelBuildError(RuntimeError):
    """A CPU kernel's C source could not be compiled or loaded (one line: what, compiler, why)."""


def compiler() -> str | None:
    """Path of the C compiler to use ($CC, cc or gcc), or None when there is none."""
    cc = os.environ.get("CC")
    if cc:
        return shutil.which(cc) or cc
    return shutil.which("cc") or shutil.which("gcc")


def _version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"the C compiler {cc} does not run: {e}") from None
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr).strip() else cc


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dfmp2" / "kernels"


def _compile(cc: str, src: Path, dest: Path) -> None:
    """Compile ``src`` into ``dest`` through a temporary file beside it (atomic rename)."""
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        out = subprocess.run(
            [cc, *CFLAGS, str(src), "-o", tmp], capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S
        )
        if out.returncode != 0:
            lines = [ln for ln in (out.stderr or out.stdout).splitlines() if "error" in ln.lower()]
            why = (lines or (out.stderr or out.stdout).splitlines() or ["no output"])[0].strip()
            raise KernelBuildError(f"compiling {src.name} with {cc} failed: {why}")
        os.replace(tmp, dest)
    except (OSError, subprocess.SubprocessError) as e:
        raise KernelBuildError(f"compiling {src.name} with {cc} failed: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@functools.cache
def load(name: str) -> tuple[ctypes.CDLL, dict]:
    """(the loaded library, what was built) for ``kernels/cpu/<name>.c``: {'library': path,
    'compiler': its version line, 'flags', 'source_sha256' (first 16 hex), 'cached': whether the
    library sits in the per-user cache (else it was built in a temporary directory of this
    process, removed once loaded), 'compiled': whether this process compiled it}."""
    src = HERE / f"{name}.c"
    cc = compiler()
    if cc is None:
        raise KernelBuildError(
            f"the CPU kernel {src.name} is compiled on first use, and no C compiler "
            "was found (set CC, or install gcc or clang)"
        )
    version = _version(cc)
    text = src.read_bytes()
    key = hashlib.sha256(text + " ".join(CFLAGS).encode() + version.encode()).hexdigest()[:16]
    info = {
        "compiler": version,
        "flags": " ".join(CFLAGS),
        "source_sha256": hashlib.sha256(text).hexdigest()[:16],
        "compiled": False,
    }
    dest = cache_dir() / f"{name}-{key}.so"
    private = None  # a temporary directory of this process, when the cache is closed
    if not dest.exists():  # one already built there is used even where the cache is read-only
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            writable = os.access(dest.parent, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            private = Path(tempfile.mkdtemp(prefix="dfmp2-kernels-"))
            dest = private / dest.name
        _compile(cc, src, dest)
        info["compiled"] = True
    try:
        lib = ctypes.CDLL(str(dest))
    except OSError as e:
        raise KernelBuildError(f"loading the compiled {src.name} ({dest}) failed: {e}") from None
    finally:
        if private is not None:  # the loaded library stays mapped; nothing is left in the temp directory
            shutil.rmtree(private, ignore_errors=True)
    return lib, dict(info, library=str(dest), cached=private is None)
