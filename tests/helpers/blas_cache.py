"""A cpu BLAS cache of the tests' own (tests/conftest.py): every run the tests start, in process or
in a subprocess, reads its choice from a fixed table instead of the user's
~/.cache/dfmp2/cpu_blas.json, so that energies and kernel names do not depend on what a probe
measured on this machine, and no run re-measures: under two xdist workers every probe sees the
other worker as load (linalg.cpu_blas_probe.judge), and a loaded table is measured again by every
process. tests/linalg/test_cpu_blas.py measures for real, in caches of its own."""

import json
import os
import tempfile
from pathlib import Path


def fixed_table(library: str = "torch") -> dict:
    """A clean, current table choosing ``library`` for every entry; its method says nothing was
    measured (and its GF/s, spreads and samples are zero)."""
    import datetime

    from dfmp2.linalg import cpu_blas, cpu_blas_probe

    c = cpu_blas
    entries = [c.entry(op, dt, cls) for op in c.OPS for dt in c.DTYPE_NAMES for cls in c.CLASSES]
    zero = {"torch": 0.0, "openblas": 0.0}
    return {
        "choice": dict.fromkeys(entries, library),
        "gflops": {e: dict(zero) for e in entries},
        "measured": {
            e: {
                "shapes": [],
                "threads": 0,
                "seconds": dict(zero),
                "gflops": dict(zero),
                "spread": dict(zero),
                "samples": 0,
                "calls": [],
                "other_cores": None,
            }
            for e in entries
        },
        "load": {"other_cores": None, "method": "none: a fixed table", "loadavg_before": None, "loadavg_after": None},
        "status": "clean",
        "why": None,
        "method": {
            "rule": f"fixed by tests/helpers/blas_cache.py: {library} everywhere, nothing measured",
            "margin": cpu_blas_probe.MARGIN,
        },
        "probe_version": cpu_blas.CACHE_VERSION,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": 0.0,
        "threads": 0,
    }


def use_fixed_cache() -> Path:
    """Point XDG_CACHE_HOME (this process and its children) at a directory of the tests' own
    (per user, kept between runs: the compiled pair epilogue is reused) holding the fixed table
    under this machine's keys for 1 to 2 * cpu_count torch threads; returns the directory."""
    home = Path(tempfile.gettempdir()) / f"dfmp2-tests-cache-{os.getuid() if hasattr(os, 'getuid') else 'user'}"
    os.environ["XDG_CACHE_HOME"] = str(home)
    write_cache(fixed_table())
    return home


def write_cache(table: dict) -> Path:
    """Write ``table`` as the cpu BLAS cache (``cpu_blas.cache_path()``: under $XDG_CACHE_HOME),
    keyed for this machine at 1 to 2 * cpu_count torch threads (atomically: other processes may be
    reading it); returns the file."""
    from dfmp2.linalg import cpu_blas

    path = cpu_blas.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"version": cpu_blas.CACHE_VERSION, "entries": {}}
    for n in range(1, 2 * (os.cpu_count() or 1) + 1):
        data["entries"][cpu_blas.cache_key(n)] = table
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)
    return path
