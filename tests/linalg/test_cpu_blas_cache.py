"""The cpu BLAS cache as a user meets it (issue 61): a damaged table is discarded with one line and
measured again, never a KeyError; an interrupted write leaves no temporary file and a dead
writer's is cleaned; the measurement's notice is one line, once per cache state, none under -q,
and it is no result warning unless the table changed the run. The probe is replaced by a fixed
table (tests/helpers/blas_cache.py): nothing here measures."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from blas_cache import fixed_table
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.linalg import cpu_blas

H2 = "2\nhydrogen\nH 0 0 0\nH 0 0 0.74\n"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """This test's own cache directory, an empty memo and notices, and a probe that returns a
    fixed table (``probes`` counts the calls) instead of measuring."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_blas, "_TABLES", {})
    monkeypatch.setattr(cpu_blas, "_NOTICES", [])
    monkeypatch.setattr(cpu_blas, "busy_now", lambda threads: 0.0)


def _probe_returns(monkeypatch, status="clean"):
    calls = []

    def probe(*a, **k):
        calls.append(status)
        return fixed_table() | {"status": status, "why": None if status == "clean" else "other processes took 2 cores"}

    monkeypatch.setattr(cpu_blas, "probe", probe)
    return calls


def _write(table) -> Path:
    path = cpu_blas.cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    key = cpu_blas.cache_key(cpu_blas.torch.get_num_threads())
    path.write_text(json.dumps({"version": cpu_blas.CACHE_VERSION, "entries": {key: table}}))
    return path


@pytest.mark.parametrize(
    "change",
    [{"load": {}}, {"load": {"other_cores": "2", "method": "x"}}, {"load": None}, {"method": {}}],
    ids=["load-empty", "load-string", "load-none", "method-empty"],
)
def test_a_damaged_table_is_discarded_named_and_measured_again(monkeypatch, change):
    path = _write(fixed_table() | change)
    table, why = cpu_blas._read_cache(path, cpu_blas.cache_key(cpu_blas.torch.get_num_threads()))
    assert table is None and "damaged" in why and str(path) in why
    calls = _probe_returns(monkeypatch)
    assert cpu_blas.auto_table().source == "probe" and calls == ["clean"]
    (line,) = cpu_blas.take_notices()
    assert "damaged" in line and str(path) in line
    (again,) = json.loads(path.read_text())["entries"].values()
    assert cpu_blas.valid_table(again)  # the next run reads it


@pytest.mark.heavy
def test_run_v_with_a_cached_load_of_nothing_ends_well(monkeypatch):
    """'load: {}' in the cache made every 'dfmp2 run -v' end in a KeyError, run after run."""
    path = _write(fixed_table() | {"load": {}})
    _probe_returns(monkeypatch)
    r = CliRunner().invoke(main, ["run", "-", "--basis", "sto-3g", "-v"], input=H2)
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.stderr and "KeyError" not in r.stderr
    (note,) = [ln for ln in r.stderr.splitlines() if ln.startswith("note: cpu BLAS")]  # one line
    assert "damaged" in note and str(path) in note
    assert cpu_blas.valid_table(next(iter(json.loads(path.read_text())["entries"].values())))


def test_an_interrupted_write_leaves_no_temporary_file(monkeypatch):
    path = cpu_blas.cache_path()

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(cpu_blas.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        cpu_blas._write_cache(path, "key", fixed_table())
    assert list(path.parent.iterdir()) == []


def test_a_dead_writers_temporary_file_is_removed_a_live_ones_kept():
    path = cpu_blas.cache_path()
    path.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = path.with_name(f".{path.name}.{dead.pid}.tmp")  # the old name: <pid>.tmp
    stale_new = path.with_name(f".{path.name}.{dead.pid}.abc123.tmp")
    live = path.with_name(f".{path.name}.{os.getppid()}.tmp")
    for p in (stale, stale_new, live):
        p.write_text("{")
    assert cpu_blas._write_cache(path, "key", fixed_table()) is None
    assert not stale.exists() and not stale_new.exists() and live.exists()
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, live.name])


def _run_json(args, input_text=H2):
    r = CliRunner().invoke(main, ["run", "-", "--basis", "sto-3g", "--json", "-", *args], input=input_text)
    assert r.exit_code == 0, r.output
    return r, json.loads(r.stdout)


def test_the_notice_is_one_line_once_per_cache_state_and_not_under_q(monkeypatch):
    calls = _probe_returns(monkeypatch, "loaded")
    r, doc = _run_json(["-q"])  # measured, but quiet
    assert calls == ["loaded"] and "cpu BLAS" not in r.stderr
    assert not any("cpu BLAS" in w for w in doc["warnings"])  # the SCF's precision: fp64 either way
    cpu_blas._TABLES.clear()  # a new process, the machine still busy: the loaded table as it is
    monkeypatch.setattr(cpu_blas, "busy_now", lambda threads: 2.0)
    r, doc = _run_json([])
    assert calls == ["loaded"] and "note: cpu BLAS" not in r.stderr and doc["ran"]["cpu_blas"]["deferred"]
    cpu_blas._TABLES.clear()  # a quiet machine: measured again, one line
    monkeypatch.setattr(cpu_blas, "busy_now", lambda threads: 0.0)
    r, doc = _run_json([])
    notes = [ln for ln in r.stderr.splitlines() if "note: cpu BLAS" in ln]
    assert calls == ["loaded", "loaded"] and len(notes) == 1 and "loaded machine" in notes[0]
    assert not any("cpu BLAS" in w for w in doc["warnings"])


def test_the_warning_goes_into_the_result_only_where_the_table_changed_the_run():
    from dfmp2.drivers.energy import blas_warnings
    from dfmp2.linalg.base import device_capabilities

    caps = device_capabilities("cpu")
    blas = {"warning": "w", "status": "loaded", "status_why": "other processes took 2 cores"}
    measured = "auto: this machine's SGEMM is 1.90x its DGEMM (measured; mixed from 1.5x)"
    for mode, warned in (("mixed", True), ("fp64", False)):
        ran = {"cpu_blas": blas, "scf": {"cycle_precision": {"mode": mode, "requested": "auto", "why": measured}}}
        assert bool(blas_warnings(ran, caps)) is warned
    ran["scf"]["cycle_precision"] = {"mode": "mixed", "requested": "mixed", "why": "asked for"}
    assert blas_warnings(ran, caps) == []
    ran = {"cpu_blas": blas | {"status": "clean"}, "scf": {"cycle_precision": {"mode": "mixed", "requested": "auto"}}}
    assert blas_warnings(ran, caps) == []
