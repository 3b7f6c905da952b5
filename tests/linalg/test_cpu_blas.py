"""The CPU's BLAS choice (linalg.cpu_blas): torch's BLAS or numpy's OpenBLAS for GEMM, SYRK and the
pair step's GEMMs. Either library gives the same energies (RHF water, UHF OH), the result names what
ran per op, a forced choice is honoured (and refused off the cpu before any work), the probe is
short and cached, and the OpenBLAS path copies none of its inputs."""

import datetime
import json
import os
import random
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.interfaces.api import run
from dfmp2.linalg import cpu_blas, cpu_blas_probe
from dfmp2.options import RunOptions

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
OH = INPUTS / "open_shell" / "hydroxyl.xyz"

PROBE_SHAPES = cpu_blas_probe.PROBE_SHAPES  # the real cases (the fixture gives each test cheap ones)
PROBE_SAMPLE_S, PROBE_MIN_SAMPLES = cpu_blas_probe.SAMPLE_S, cpu_blas_probe.MIN_SAMPLES

pytestmark = pytest.mark.skipif(cpu_blas.numpy_blas_info() is None, reason="numpy here has no OpenBLAS")


# a probe's mechanics in a fraction of a second (tests only): tiny cases (not inside their classes),
# short samples, few of them
CHEAP_SHAPES = {
    "gemm": {"small": ((16, 16, 16, "nn"),), "medium": ((32, 64, 32, "tt"),), "large": ((32, 48, 64, "tn"),)},
    "syrk": {"small": ((16, 64),), "medium": ((32, 64),), "large": ((48, 64),)},
    "pair": {"small": ((8, 32, 16, "tn"),), "medium": ((16, 32, 32, "tn"),), "large": ((24, 48, 32, "tn"),)},
}


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test's own cache directory (the user's ~/.cache is never read or written here), an
    empty memo, and a cheap probe (CHEAP_SHAPES, 1 ms samples, 2 to 3 of them)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(cpu_blas, "_TABLES", {})
    monkeypatch.setattr(cpu_blas_probe, "PROBE_SHAPES", CHEAP_SHAPES)
    monkeypatch.setattr(cpu_blas_probe, "SAMPLE_S", 0.001)
    monkeypatch.setattr(cpu_blas_probe, "MIN_SAMPLES", 2)
    monkeypatch.setattr(cpu_blas_probe, "MAX_SAMPLES", 3)
    monkeypatch.setattr(cpu_blas_probe, "AFTER_ELEMS", 1 << 10)
    monkeypatch.setattr(cpu_blas_probe, "BUSY_CHECK_S", 0.05)


@pytest.fixture
def quiet_machine(monkeypatch):
    """Other processes' CPU read as none: the probe's table is judged by its spreads alone."""
    _load(monkeypatch, 0.0)
    monkeypatch.setattr(cpu_blas_probe, "SPREAD_OK", float("inf"))  # 1 ms samples on a busy machine: not judged here


@pytest.fixture
def loaded_machine(monkeypatch):
    """Other processes read as taking every core during every probe (the loaded case, simulated)."""
    _load(monkeypatch, 1.0)


def _load(monkeypatch, fraction: float) -> None:
    """The load measurement replaced: other processes use ``fraction`` of every core and take it
    from the probe's threads."""
    monkeypatch.setattr(cpu_blas_probe, "other_cores", lambda a, b: fraction * os.cpu_count())
    monkeypatch.setattr(cpu_blas_probe, "contention", lambda a, b, threads: fraction * threads)


def _resolve():
    return linalg.get_backend("cpu").blas.describe()


@pytest.mark.parametrize("xyz", [WATER, OH], ids=["water-RHF", "OH-UHF"])
def test_torch_and_openblas_give_the_same_energies(xyz):
    """Each library forced in turn: E_HF, E_OS, E_SS agree to 1e-12 Eh (cross-check of the two
    libraries; PySCF agreement of these energies is tests/mp2/test_pipeline.py's and test_ump2.py's).
    The SCF in fp64 throughout: the mixed SCF's fp32 cycles take a library-dependent path to the
    same converged state (E_HF within 1e-10 Eh, tests/scf/test_dfhf.py), which moves E_corr by ~2e-12."""
    res = {mode: run(xyz, RunOptions(cpu_blas=mode, scf_precision="fp64")) for mode in ("torch", "openblas")}
    t, o = res["torch"], res["openblas"]
    for name in ("e_hf", "e_os", "e_ss"):
        assert abs(getattr(t, name) - getattr(o, name)) < 1e-12, name
    used_t, used_o = t.ran["kernels"], o.ran["kernels"]
    assert not any("openblas" in k for k in used_t)
    assert any(k.startswith("gemm:openblas.dgemm") for k in used_o)
    assert any(k.startswith("mp2_pair_energy:openblas.") for k in used_o)
    if xyz == WATER:  # our DF-RHF: its K build's SYRK
        assert any(k.startswith("syrk:openblas.dsyrk") for k in used_o)
        assert any(k.startswith("syrk:openblas.dsyrk") for k in o.ran["scf"]["kernels"])


def test_the_result_names_library_and_kernel_per_op(quiet_machine):
    d = json.loads(json.dumps(run(WATER, RunOptions(cpu_blas="openblas")).to_dict()))
    blas = d["ran"]["cpu_blas"]
    assert blas["mode"] == "openblas" and blas["source"] == "user" and blas["choice"] is None
    assert blas["status"] is None and blas["probe"] is None and blas["warning"] is None
    ob, tb = blas["libraries"]["openblas"], blas["libraries"]["torch"]
    assert ob["library"] == "OpenBLAS" and ob["version"] and ob["architecture"] and ob["threads"] >= 1
    assert ob["threads"] == torch.get_num_threads()  # the pools agree: no oversubscription
    assert tb["library"] and tb["torch"] == torch.__version__
    for op in ("gemm", "syrk", "mp2_pair_energy"):
        assert any(k["op"] == op and k["kernel"].startswith("openblas.") for k in d["ran"]["kernels"]), op
    res = run(WATER, RunOptions())
    auto = json.loads(json.dumps(res.to_dict()))["ran"]["cpu_blas"]
    assert auto["mode"] == "auto" and auto["source"] == "probe" and auto["remeasured_because"] == "no cache file"
    assert set(auto["choice"]) == set(auto["probe_gflops"]) == set(auto["probe"]["measured"])
    assert {e.split("/")[0] for e in auto["choice"]} == set(cpu_blas.OPS)
    assert set(auto["choice"].values()) <= {"torch", "openblas"}
    assert auto["status"] == "clean" and auto["warning"] is None and not any("BLAS" in w for w in res.warnings)


def test_the_probe_records_how_it_measured_and_a_clean_table_is_reused(quiet_machine, monkeypatch):
    """The cache keeps, per entry, the shapes, best seconds, GF/s, spreads, samples and other
    processes' cores, and for the table the load, the method, the probe's version and date; the
    next process (memo cleared) reads it without probing. Real PROBE_SHAPES: their operands work."""
    monkeypatch.setattr(cpu_blas_probe, "PROBE_SHAPES", PROBE_SHAPES)
    monkeypatch.setattr(cpu_blas_probe, "MAX_SAMPLES", 2)
    first = _resolve()
    assert first["source"] == "probe" and first["status"] == "clean" and first["cache_error"] is None
    data = json.loads(Path(first["cache"]).read_text())
    assert data["version"] == cpu_blas.CACHE_VERSION == 4
    (table,) = data["entries"].values()
    assert table["probe_version"] == cpu_blas.CACHE_VERSION and table["status"] == "clean"
    assert table["method"]["sample_s"] == cpu_blas_probe.SAMPLE_S and table["method"]["margin"] == cpu_blas_probe.MARGIN
    assert table["method"]["min_samples"] == table["method"]["max_samples"] == 2
    assert table["method"]["spread_ok"] == cpu_blas_probe.SPREAD_OK
    assert table["load"]["other_cores"] == 0.0 and table["load"]["method"].startswith("/proc/stat")
    datetime.datetime.fromisoformat(table["date"])
    for e, r in table["measured"].items():
        op, _, cls = e.split("/")
        assert r["shapes"] == [list(c) for c in PROBE_SHAPES[op][cls]]
        assert r["samples"] == 2 and set(r["calls"]) == {"torch", "openblas"} and r["other_cores"] == 0.0
        assert all(len(c) == len(r["shapes"]) and min(c) >= 1 for c in r["calls"].values())
        assert r["contention"] == 0.0 and r["wall_s"] > 0 and len(r["case_seconds"]) == len(r["shapes"])
        assert set(r["spread"]) == set(r["gflops"]) == {"torch", "openblas"} and min(r["gflops"].values()) > 0
        assert r["threads"] == (1 if op == "pair" else torch.get_num_threads())
    monkeypatch.setattr(cpu_blas, "probe", lambda *a, **k: pytest.fail("a clean, current table was measured again"))
    cpu_blas._TABLES.clear()  # a new process
    again = _resolve()
    assert again["source"] == "cache" and again["choice"] == first["choice"] and again["remeasured_because"] is None


def test_a_table_measured_under_load_is_used_once_and_measured_again(loaded_machine, monkeypatch):
    """Load simulated (other processes read as taking every core): the table is used for this run,
    recorded in the result (a warning only where it chose the SCF's precision), and written
    marked 'loaded'. The next process, still on a busy
    machine, uses it as it is and says why; the next on a quiet machine measures again."""
    res = run(WATER, RunOptions())
    blas = res.ran["cpu_blas"]
    assert blas["source"] == "probe" and blas["status"] == "loaded" and "of the probe's cores" in blas["status_why"]
    assert blas["warning"] and blas["warning"] not in res.warnings  # recorded in ran, no result warning
    cycles = res.ran["scf"]["cycle_precision"]  # ... unless the table chose the SCF's precision
    assert any("cpu BLAS" in w for w in res.warnings) == (cycles["mode"] == "mixed" and "measured" in cycles["why"])
    (table,) = json.loads(Path(blas["cache"]).read_text())["entries"].values()
    assert table["status"] == "loaded" and table["load"]["contention"] >= 1.0
    first = cpu_blas.entry("gemm", torch.float64, "small")  # loaded from the first: no further pass
    assert table["method"]["min_samples_after"] == first
    assert all(r["samples"] == cpu_blas_probe.MIN_SAMPLES for r in table["measured"].values())
    cpu_blas._TABLES.clear()
    real_probe = cpu_blas.probe
    monkeypatch.setattr(cpu_blas, "probe", lambda *a, **k: pytest.fail("measured again on a busy machine"))
    busy = _resolve()
    assert busy["source"] == "cache" and busy["status"] == "loaded" and busy["warning"]
    assert busy["deferred"].startswith("the cached table is loaded") and "not measured again now" in busy["deferred"]
    cpu_blas._TABLES.clear()
    monkeypatch.setattr(cpu_blas, "probe", real_probe)
    _load(monkeypatch, 0.0)  # a quiet machine
    again = _resolve()
    assert again["source"] == "probe" and again["remeasured_because"].startswith("the cached table is loaded")
    assert again["status"] in ("clean", "noisy") and again["deferred"] is None


def test_busy_processes_mark_the_table_loaded():
    """Two processes spinning on each core (four at least) while a (cheap) probe runs: /proc/stat
    sees them and the table is not trusted."""
    if cpu_blas_probe.cpu_mark() is None:
        pytest.skip("no /proc/stat here")
    ncpu = os.cpu_count() or 1
    if ncpu > 16:
        pytest.skip(f"{ncpu} cores: too many to load for a test")
    code = "import time\nt = time.time()\nprint('spinning', flush=True)\nwhile time.time() - t < 20: pass"
    # two spinners a core: with one a core, a one-thread probe on two cores (three runnable
    # threads) lost only ~1/3 of a core, too near LOADED_CORES to be judged loaded every time
    busy = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE) for _ in range(2 * max(2, ncpu))]
    try:
        for p in busy:
            assert p.stdout.readline() == b"spinning\n"  # every spinner is running before the probe starts
        d = _resolve()
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # loaded over the whole probe, or during one entry (judge's two rules: with another pytest
    # worker on the machine the spinners may share the cores so the whole-probe mean stays under
    # LOADED_CORES while one entry is well over ENTRY_LOADED_CORES)
    entries = [r["contention"] or 0.0 for r in d["probe"]["measured"].values()]
    assert d["status"] == "loaded"
    assert d["probe"]["load"]["contention"] > cpu_blas.LOADED_CORES or max(entries) > cpu_blas_probe.ENTRY_LOADED_CORES
    assert d["warning"] and "loaded" in d["warning"]


def _cached_table(**change) -> dict:
    """A clean table from a cheap probe (written to the test's cache), changed as given."""
    d = _resolve()
    path = Path(d["cache"])
    data = json.loads(path.read_text())
    (key,) = data["entries"]
    data["entries"][key].update(change)
    path.write_text(json.dumps(data))
    cpu_blas._TABLES.clear()
    return data


@pytest.mark.parametrize(
    "change, why",
    [
        ({"status": "noisy", "why": "spread"}, "the cached table is noisy"),
        ({"date": "2020-01-01T00:00:00+00:00"}, "days old (over 30)"),
        ({"date": "2999-01-01T00:00:00+00:00"}, "dated in the future"),
        ({"choice": {}}, "a damaged table"),
        ({"gflops": {}}, "a damaged table"),
        ({"seconds": "1.5"}, "a damaged table"),
        ({"measured": None}, "a damaged table"),
        ("version 3", "cache version 3, this program's 4"),
    ],
    ids=["noisy", "old", "future", "damaged", "no-gflops", "odd-seconds", "no-measured", "other-version"],
)
def test_noisy_old_damaged_and_other_version_caches_are_measured_again(quiet_machine, change, why):
    if change == "version 3":
        data = _cached_table()
        data["version"] = 3
        Path(cpu_blas.cache_path()).write_text(json.dumps(data))
    else:
        _cached_table(**change)
    d = _resolve()
    assert d["source"] == "probe" and why in d["remeasured_because"]
    assert d["status"] == "clean"  # and the cache now holds the new, clean table
    cpu_blas._TABLES.clear()
    assert _resolve()["source"] == "cache"


def test_a_table_is_trusted_whole_or_not_at_all(quiet_machine):
    """Every field the program reads is checked when the cache is read: a table with one entry's
    GF/s, spread or samples missing or of another type, a date that is not one, or a status
    without its why is damaged (measured again), never half used (KeyError 'gflops' at
    the end of every run)."""
    data = _cached_table()
    (table,) = data["entries"].values()
    assert cpu_blas.valid_table(table)
    e = next(iter(table["measured"]))
    bad = []
    for path, value in [
        (("gflops", e), {"torch": 1.0}),
        (("gflops", e, "torch"), "fast"),
        (("gflops", e, "openblas"), float("nan")),
        (("measured", e, "spread"), None),
        (("measured", e, "gflops"), {"torch": 1.0, "openblas": -1.0}),
        (("measured", e, "samples"), "3"),
        (("seconds",), None),
        (("date",), 20261127),
        (("date",), "yesterday"),
        (("why",), 5),
        (("load",), []),
        (("status",), "fine"),
    ]:
        t = json.loads(json.dumps(table))
        where = t
        for k in path[:-1]:
            where = where[k]
        where[path[-1]] = value
        bad.append(cpu_blas.valid_table(t))
    assert not any(bad), bad
    assert not cpu_blas.valid_table(None) and not cpu_blas.valid_table([]) and not cpu_blas.valid_table({})


@pytest.mark.parametrize(
    "torch_s, openblas_s, spreads, expected",
    [
        (1.0, 0.85, (0.06, 0.06), True),  # 15 % faster: beyond the margin, within margin + noise
        (1.0, 0.85, (0.02, 0.02), False),  # quiet enough: no spread over SPREAD_OK
        (1.0, 0.50, (0.2, 0.2), True),  # too noisy to tell: a 2x lead hidden by the spreads
        (1.0, 0.40, (0.2, 0.2), False),  # openblas either way
        (1.0, 1.30, (0.5, 0.1), False),  # torch either way
    ],
)
def test_noise_marks_a_table_only_where_it_decides_the_choice(torch_s, openblas_s, spreads, expected):
    r = {"seconds": {"torch": torch_s, "openblas": openblas_s}, "spread": dict(zip(("torch", "openblas"), spreads))}
    assert cpu_blas_probe.undecided(r) is expected
    status, why = cpu_blas_probe.judge({"gemm/fp64/large": dict(r, contention=0.0)}, 0.0)
    assert status == ("noisy" if expected else "clean") and (why is None) is not expected


@pytest.mark.parametrize(
    "torch_s, openblas_s, spreads, expected",
    [
        (1.0, 0.70, (0.01, 0.01), "openblas"),  # 30 % faster, quiet
        (1.0, 0.92, (0.0, 0.0), "torch"),  # within the 10 % margin
        (1.0, 0.85, (0.04, 0.04), "torch"),  # 15 % faster, but within margin + noise
        (1.0, 0.80, (0.04, 0.04), "openblas"),  # beyond margin + noise
        (1.0, 1.00, (0.0, 0.0), "torch"),  # a tie
        (1.0, 0.50, (0.3, 0.3), "torch"),  # too noisy to tell
    ],
)
def test_a_close_call_goes_to_torch(torch_s, openblas_s, spreads, expected):
    seconds = {"torch": torch_s, "openblas": openblas_s}
    assert cpu_blas_probe.decide(seconds, dict(zip(("torch", "openblas"), spreads))) == expected


def test_two_probes_of_one_machine_agree(monkeypatch):
    """Injected timings (each library's time per entry, each sample jittered by up to ±2 % from
    its own random stream): two probes choose alike, openblas exactly where it is > 20 % faster,
    torch where the two are within 5 %."""
    ratio = {e: 1.0 for e in _entries()}  # openblas / torch time
    ratio.update({"gemm/fp64/large": 0.7, "syrk/fp32/large": 0.75, "syrk/fp64/medium": 1.3})
    ratio.update({"pair/fp64/large": 0.96, "gemm/fp32/medium": 1.04})

    class Call:
        def __init__(self, seconds):
            self.seconds = seconds

        def __call__(self):
            pass

    # each case in its class: its entry from its flops
    monkeypatch.setattr(cpu_blas_probe, "PROBE_SHAPES", PROBE_SHAPES)
    tables = []
    for seed in (1, 2):
        rng = random.Random(seed)
        monkeypatch.setattr(cpu_blas_probe, "_sample", lambda fn, n: fn.seconds * (1 + rng.uniform(-0.02, 0.02)))
        monkeypatch.setattr(cpu_blas_probe, "_probe_calls", _probe_calls_by_entry(ratio, Call))
        tables.append(cpu_blas_probe.probe(sample_s=0.001, min_samples=3, max_samples=6))
    assert tables[0]["choice"] == tables[1]["choice"]
    assert {e for e, lib in tables[0]["choice"].items() if lib == "openblas"} == {"gemm/fp64/large", "syrk/fp32/large"}


def test_the_libraries_take_turns_by_passes_not_call_by_call(monkeypatch, quiet_machine):
    """All of torch's first-pass calls come before OpenBLAS's, and a torch pass after an OpenBLAS
    one starts after SETTLE_S (OpenBLAS's idle workers spin ~0.1 s and halve torch's GEMMs)."""
    log = []
    monkeypatch.setattr(cpu_blas_probe.time, "sleep", lambda s: log.append(("sleep", s)))

    def calls(op, case, dtype):
        return 1e6, {lib: (lambda lib=lib: log.append(lib)) for lib in ("torch", "openblas")}

    monkeypatch.setattr(cpu_blas_probe, "_probe_calls", calls)
    rng = random.Random(0)
    monkeypatch.setattr(cpu_blas_probe, "_sample", lambda fn, n: (fn(), 1e-3 * (1.0 + 0.5 * rng.random()))[1])
    monkeypatch.setattr(cpu_blas_probe, "SPREAD_OK", 0.05)  # the samples' 50 % jitter asks for a further pass
    cpu_blas_probe.probe(sample_s=0.001, min_samples=3, max_samples=4)
    runs = [log[0]]
    for x in log[1:]:
        if x != runs[-1]:
            runs.append(x)
    assert runs == ["torch", "openblas", ("sleep", cpu_blas_probe.SETTLE_S), "torch", "openblas"], runs


def _entries():
    return [cpu_blas.entry(op, dt, c) for op in cpu_blas.OPS for dt in cpu_blas.DTYPE_NAMES for c in cpu_blas.CLASSES]


def _probe_calls_by_entry(ratio, Call):
    """A stand-in for cpu_blas_probe._probe_calls: the entry of each case from its flops' class."""

    def calls(op, case, dtype):
        flops = 2.0 * case[0] ** 2 * case[1] if op == "syrk" else 2.0 * case[0] * case[1] * case[2]
        e = cpu_blas.entry(op, dtype, cpu_blas.size_class(flops))
        return flops, {"torch": Call(1e-3), "openblas": Call(1e-3 * ratio[e])}

    return calls


def test_the_probe_cases_lie_in_their_classes_and_fit_its_time():
    """Each probe case's flops lie in its class, and the probe's least time (MIN_SAMPLES samples of
    SAMPLE_S, plus the calibration, per case and library) stays within 5 s; its most, within
    BUDGET_S plus MIN_SAMPLES rounds."""
    for op, classes in PROBE_SHAPES.items():
        for cls, cases in classes.items():
            for case in cases:
                flops = 2.0 * case[0] ** 2 * case[1] if op == "syrk" else 2.0 * case[0] * case[1] * case[2]
                assert cpu_blas.size_class(flops) == cls, (op, cls, case)
    ncases = sum(len(c) for classes in PROBE_SHAPES.values() for c in classes.values()) * len(cpu_blas.DTYPE_NAMES)
    least = ncases * 2 * (PROBE_MIN_SAMPLES + 1) * PROBE_SAMPLE_S
    assert least <= 5.0, least


def test_a_cache_that_cannot_be_written_does_not_break_a_run(tmp_path, monkeypatch, quiet_machine):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    d = _resolve()
    assert d["source"] == "probe" and d["cache_error"] and "could not be cached" in d["warning"]
    (tmp_path / "c" / "dfmp2").mkdir(parents=True)
    (tmp_path / "c" / "dfmp2" / "cpu_blas.json").write_text("{not json")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    cpu_blas._TABLES.clear()
    d = _resolve()
    assert d["source"] == "probe" and d["remeasured_because"] == "unreadable cache (JSONDecodeError)"
    assert json.loads((tmp_path / "c" / "dfmp2" / "cpu_blas.json").read_text())["version"] == cpu_blas.CACHE_VERSION


def test_bench_blas_measures_now_and_writes_the_cache(quiet_machine, tmp_path):
    """``dfmp2 bench --blas`` probes even over a clean cache, writes it and prints the table (exit
    0); with another timing option it is one error line, exit 2."""
    first = _resolve()  # a clean cache already there
    cpu_blas._TABLES.clear()
    r = CliRunner().invoke(main, ["bench", "--blas"])
    assert r.exit_code == 0, r.output
    assert "cpu BLAS choice" in r.stdout and "gemm/fp64/large" in r.stdout and "dfmp2 bench --blas" in r.stdout
    assert _flat(f"wrote {first['cache']} (clean: later runs use it)") in _flat(r.stderr)
    (table,) = json.loads(Path(first["cache"]).read_text())["entries"].values()
    assert table["date"] >= first["probe_date"] and table["status"] == "clean"
    r = CliRunner().invoke(main, ["bench", "--blas", "--waters", "1"])
    assert r.exit_code == 2 and r.stderr.startswith("error: --blas") and r.stderr.count("\n") == 1, r.output


def test_run_verbose_prints_the_choice_and_its_evidence(quiet_machine, tmp_path):
    r = CliRunner().invoke(main, ["run", str(WATER), "-v"])
    assert r.exit_code == 0, r.output
    out = _flat(r.output)
    assert _flat("cpu BLAS choice (--cpu-blas auto)") in out and _flat("spread % t/o") in out
    assert "syrk/fp32/medium" in out and _flat("measured by this run (no cache file); clean;") in out
    assert _flat("cpu BLAS │ auto, measured by this run (clean,") in out  # the summary row


def _flat(text: str) -> str:
    """Text without white space and table rules (rich wraps at the terminal's width)."""
    return re.sub(r"[\s│]+", "", text)


@pytest.mark.parametrize("mode", ["torch", "openblas"])
def test_a_forced_choice_is_honoured_without_a_probe(mode, monkeypatch):
    monkeypatch.setattr(cpu_blas, "probe", lambda *a, **k: pytest.fail("a forced choice probed"))
    be = linalg.get_backend("cpu", cpu_blas=mode)
    for dtype in (torch.float64, torch.float32):
        a = torch.rand(300, 200, dtype=dtype)
        be.gemm(a, a, trans_a=True)
        be.syrk(a, trans=True)
        B = torch.rand(200, 4 * 30, dtype=dtype)  # the pipeline's layout: Bt (naux, nocc*nvir)
        Bi = B.view(200, 4, 30).permute(1, 2, 0)
        e = torch.linspace(-1.0, -0.5, 4, dtype=torch.float64)
        v = torch.linspace(0.5, 2.0, 30, dtype=torch.float64)
        be.mp2_pair_energy(Bi, Bi, e, e, v, symmetric=True)
    lib = "openblas" if mode == "openblas" else "torch"
    assert all(k.split(":", 1)[1].startswith(lib) for k in be.kernels_used), be.kernels_used
    assert be.describe()["cpu_blas"]["source"] == "user"


def test_openblas_off_the_cpu_is_refused_before_any_work():
    with pytest.raises(InputError) as e:
        RunOptions(device="trn1", cpu_blas="openblas").check_choices()
    assert e.value.option == "cpu_blas" and "\n" not in str(e.value)
    with pytest.raises(InputError) as e:
        run(WATER, RunOptions(device="cuda", cpu_blas="openblas"))
    assert e.value.option == "cpu_blas"
    with pytest.raises(ValueError, match="only to the cpu"):
        linalg.get_backend("trn1", cpu_blas="openblas")
    with pytest.raises(InputError):
        RunOptions(cpu_blas="mkl").check_choices()


def test_the_openblas_path_copies_no_input():
    """np.matmul is handed the tensors' own memory (transposed views as BLAS 'T', x @ x.T as SYRK):
    numpy allocates nothing (tracemalloc sees numpy's allocations), and the result equals torch's."""
    be = linalg.get_backend("cpu", cpu_blas="openblas")
    a = torch.rand(400, 300, dtype=torch.float64)
    b = torch.rand(400, 250, dtype=torch.float64)
    Bt = torch.rand(256, 8 * 40, dtype=torch.float64)
    Bi = Bt.view(256, 8, 40).permute(1, 2, 0)  # (nocc, nvir, naux) view, as the pair step's
    ptrs = (a.data_ptr(), b.data_ptr(), Bt.data_ptr())
    out = torch.empty(300, 250, dtype=torch.float64)
    e = torch.linspace(-1.0, -0.5, 8, dtype=torch.float64)
    v = torch.linspace(0.5, 2.0, 40, dtype=torch.float64)
    be.gemm(a, b, trans_a=True, out=out)  # warm-up (first calls may allocate buffers)
    tracemalloc.start()
    try:
        c = be.gemm(a, b, trans_a=True, out=out)
        s = be.syrk(a, trans=True)
        be.mp2_pair_energy(Bi, Bi, e, e, v, symmetric=True)
        numpy_bytes = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert numpy_bytes < 64 * 1024, numpy_bytes  # a copy of a would be 960 kB
    assert c is out and (a.data_ptr(), b.data_ptr(), Bt.data_ptr()) == ptrs
    assert torch.allclose(c, a.mT @ b, rtol=1e-13, atol=1e-12)
    assert torch.allclose(s, a.mT @ a, rtol=1e-13, atol=1e-12) and torch.equal(s, s.mT)
    assert set(be.kernels_used) == {
        "gemm:openblas.dgemm(numpy.matmul)",
        "syrk:openblas.dsyrk(numpy.matmul)",
        "mp2_pair_energy:openblas.dgemm(numpy.matmul, tiles)+pair_epilogue.c(fp64 sums)",
    }
    # a layout OpenBLAS would need copied goes to torch, and the record says so
    be.gemm(a[:, ::2], b, trans_a=True)
    assert be.kernels_used.get("gemm:torch.matmul") == 1


def test_a_truncated_cache_is_measured_again(quiet_machine):
    """A cache file cut short (a full disk, a killed writer of an older version) is unreadable:
    the table is measured again and the run goes on."""
    _cached_table()
    path = Path(cpu_blas.cache_path())
    path.write_text(path.read_text()[: len(path.read_text()) // 2])
    cpu_blas._TABLES.clear()
    d = _resolve()
    assert d["source"] == "probe" and "unreadable" in d["remeasured_because"]
    assert json.loads(path.read_text())["entries"]  # written whole again


_WRITER = """
import sys
from pathlib import Path
from dfmp2.linalg import cpu_blas, cpu_blas_probe
path, who = Path(sys.argv[1]), sys.argv[2]
for i in range(40):
    assert cpu_blas._write_cache(path, f"{who}-{i}", {"n": i}) is None
"""


@pytest.mark.heavy
def test_two_writers_at_once_never_leave_a_damaged_file(tmp_path):
    """Two processes writing the cache at once (two runs that probed together): every read in
    between and the file at the end are whole JSON of this version (atomic replace; a lost
    update is possible, a damaged file is not)."""
    import subprocess
    import sys

    path = tmp_path / "cache" / "dfmp2" / "cpu_blas.json"
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(path), who], env=env, stderr=subprocess.PIPE, text=True)
        for who in ("a", "b")
    ]
    reads = 0
    while any(p.poll() is None for p in procs):
        if path.exists():
            data = json.loads(path.read_text())  # never half written
            assert data["version"] == cpu_blas.CACHE_VERSION
            reads += 1
    assert all(p.wait(timeout=60) == 0 for p in procs), [p.stderr.read() for p in procs]
    data = json.loads(path.read_text())
    assert data["version"] == cpu_blas.CACHE_VERSION and data["entries"] and reads > 0
