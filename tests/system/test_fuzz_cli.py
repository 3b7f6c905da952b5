"""Fuzzing what the XYZ reader and the option parsers see, in-process with CliRunner.

The property, for every input: exit 0, or exit 2 with exactly one ``error:`` line on stderr; never a
traceback or a leaked warning; and no file created other than the requested output (--json).

Kept fast (well under 30 s) and deterministic (``derandomize=True``): runs that would reach an
SCF are tiny (H2, LiH, HeH+ and friends in small bases) or stop at the memory plan (``--memory`` far
below need, which is checked before the SCF; the basis, auxiliary-basis, geometry and
electron-count checks come before it). Outside the fuzz domain: output paths, --scratch,
--checkpoint and --resume (tests/io/test_outputs.py and tests/io/test_checkpoint.py).
"""

import json
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfmp2.benchmarks import shapes as shapes_mod
from dfmp2.benchmarks import waters as waters_mod
from dfmp2.cli.main import main
from dfmp2.errors import InputError

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
REFUSED_MEMORY = "0.001MB"  # below any plan: the run stops before the SCF


def check(args, workdir: Path, allowed=()):
    """Invoke ``dfmp2 args`` in ``workdir``; assert the property; return the result."""
    before = {p.name for p in workdir.iterdir()}
    res = CliRunner().invoke(main, args)
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.exit_code in (0, 2), (args, res.exit_code, res.output, res.exc_info)
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exc_info)
    assert "Traceback" not in res.output and "Warning" not in res.stderr, (args, res.output)
    if res.exit_code == 2:
        assert len(err) == 1 and err[0].startswith("error: "), (args, res.stderr)
    created = {p.name for p in workdir.iterdir()} - before
    assert created <= set(allowed), (args, created)
    if res.exit_code == 2:
        assert not created, (args, created)  # a refused run writes nothing
    return res


# ---------------------------------------------------------------------------------------------
# XYZ files
# ---------------------------------------------------------------------------------------------
@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes_as_xyz(data):
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "mol.xyz"
        p.write_bytes(data)
        check(["run", str(p), "-q", "--memory", REFUSED_MEMORY], Path(d))


def _text_xyz(lines):
    return "\n".join(lines) + "\n"


SYMBOLS = st.sampled_from(
    [
        "H",
        "He",
        "C",
        "N",
        "O",
        "F",
        "Ne",
        "Li",
        "Na",
        "Cl",
        "I",
        "Xe",
        "h",
        "cL",
        "1",
        "8",
        "0",
        "119",
        "Qq",
        "X",
        "D",
        "O2",
        "²",
        "\x00",
        "H+",
    ]
)
NUMBER = st.one_of(
    st.floats(min_value=-10, max_value=10, allow_nan=False).map(repr),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(
        ["nan", "-inf", "1e400", "1e200", "0x10", "1_0", "1,5", "", "1.2.3", "+.5", "1e-400", "١", "0.0 0.1"]
    ),
)
COMMENT = st.one_of(
    st.text(max_size=30),
    st.builds(
        lambda k, v: f"{k}={v}",
        st.sampled_from(["charge", "multiplicity", "mult", "Charge"]),
        st.one_of(
            st.integers(-5, 5).map(str), st.sampled_from(["2.5", "", "+", "1e0", "9" * 30, "0", "-1", "1;", "٣"])
        ),
    ),
)


GOOD_ATOM = st.tuples(
    st.sampled_from(["H", "He", "C", "N", "O", "F", "Ne", "Na", "Cl", "I", "Li", "8", "h"]),
    st.lists(st.floats(min_value=-10, max_value=10).map(repr), min_size=3, max_size=3),
)
WILD_ATOM = st.tuples(SYMBOLS, st.lists(NUMBER, min_size=2, max_size=5))


@FUZZ
@given(
    atoms=st.one_of(
        st.lists(GOOD_ATOM, min_size=1, max_size=4), st.lists(st.one_of(GOOD_ATOM, WILD_ATOM), min_size=0, max_size=4)
    ),
    comment=st.one_of(st.just(""), COMMENT),
    count=st.one_of(
        st.none(), st.none(), st.integers(-2, 6).map(str), st.sampled_from(["", "three", "3.0", "99999999999", "+2"])
    ),
)
def test_atom_lists_stop_at_the_memory_plan(atoms, comment, count):
    """Malformed and well-formed atom lists; a well-formed one reaches the memory plan, which
    refuses it before the SCF (so coincident atoms and any element are in the domain)."""
    lines = [str(len(atoms)) if count is None else count, comment.replace("\n", " ").replace("\r", " ")]
    lines += [" ".join([s] + xyz) for s, xyz in atoms]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "mol.xyz"
        p.write_text(_text_xyz(lines), encoding="utf-8")
        res = check(["run", str(p), "-q", "--memory", REFUSED_MEMORY], Path(d))
        assert res.exit_code == 2


SMALL = [("H", 1), ("He", 2), ("Li", 3), ("Be", 4), ("B", 5), ("F", 9), ("Ne", 10)]


@settings(FUZZ, max_examples=25)
@given(
    atoms=st.lists(st.sampled_from(SMALL), min_size=1, max_size=2),
    r=st.one_of(st.floats(0.5, 4.0), st.floats(0.0, 0.2)),
    charge=st.integers(-4, 3),
    basis=st.sampled_from(["sto-3g", "cc-pvdz"]),
    json_out=st.booleans(),
)
def test_tiny_molecules_that_run(atoms, r, charge, basis, json_out):
    """Real runs on tiny molecules, Li and Be among them (their cc-pVDZ JK-fit set lacks them: a
    fallback set is used; odd electron counts run as doublets on UHF): exit 0 with the energies,
    or one error line (no virtual orbitals, no electrons, more electrons than the shells hold (He2- in STO-3G), atoms
    closer than 0.1 Å)."""
    lines = [str(len(atoms)), f"charge={charge}"]
    lines += [f"{s} 0.0 0.0 {k * r:.6f}" for k, (s, _) in enumerate(atoms)]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "mol.xyz"
        p.write_text(_text_xyz(lines))
        args = ["run", str(p), "-q", "--basis", basis, "--scf", "exact"]
        if json_out:
            args += ["--json", str(Path(d) / "out.json")]
        res = check(args, Path(d), allowed={"out.json"})
        if res.exit_code == 0:
            assert "E(MP2)" in res.output
            if json_out:
                # a one-electron molecule (H, He+ as a doublet) has no correlation: exactly 0 up to rounding
                assert json.loads((Path(d) / "out.json").read_text())["energies"]["e_corr"] <= 1e-12


# ---------------------------------------------------------------------------------------------
# options of `dfmp2 run`
# ---------------------------------------------------------------------------------------------
MEMORY = st.one_of(
    st.sampled_from(
        [
            "nan",
            "inf",
            "-inf",
            "1e400",
            "0",
            "-1",
            "1e-300",
            "4GB",
            "512MiB",
            "0.5GiB",
            "",
            "GB",
            "4 GB",
            "4_000",
            "1e3MB",
            "NaNGB",
            "infMiB",
            "0x10",
            "4TB",
            "١٠٠٠",
        ]
    ),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet="0123456789.eE+-_ GMBibnaf", max_size=8),
)
DEVICE = st.sampled_from(
    [
        "cpu",
        "cuda",
        "cuda:0",
        "cuda:99999999999999999999",
        "cuda:-1",
        "trn1",
        "trn2",
        "tpu",
        "",
        "CPU",
        "cpu:0",
        "cuda:",
    ]
)
INT_TEXT = st.one_of(st.integers(-10, 100).map(str), st.sampled_from(["2.5", "", "x", "1e3", "9" * 40]))


BASIS_NAME = st.sampled_from(
    [
        "sto-3g",
        "6-31g*",
        "6-31g**",
        "6-311++g(2d,2p)",
        "pcseg-1",
        "aug-cc-pvtz",
        "def2-universal-jkfit",
        "cc-pvdz-jkfit",
        "weigend",
        "lanl2dz",
        "nonsense",
        "",
        "cc-pvdz[/x]",
        "../basis",
        "autoaux",
    ]
)


RUN_OPTIONS = {  # option: (values a run accepts, values it must refuse with one line)
    "--memory": (st.sampled_from(["4GB", "512MiB", "0.5GiB", "1e3MB", "200", "4 GB"]), MEMORY),
    "--device": (st.just("cpu"), DEVICE),
    "--precision": (st.sampled_from(["fp64", "fp32"]), st.sampled_from(["fp16", "", "FP64"])),
    "--scf": (st.sampled_from(["df", "exact"]), st.sampled_from(["hf", ""])),
    "--storage": (st.sampled_from(["auto", "memory", "disk"]), st.sampled_from(["ram", ""])),
    "--charge": (st.sampled_from(["0", "2", "-1"]), st.one_of(st.integers(-(10**6), 10**6).map(str), INT_TEXT)),
    "--multiplicity": (st.just("1"), INT_TEXT),
    "--basis": (
        st.sampled_from(["cc-pvdz", "sto-3g", "6-31g*", "6-31g**", "pcseg-1", "def2-svp"]),
        st.one_of(BASIS_NAME, st.text(max_size=12)),
    ),
    "--auxbasis": (st.sampled_from(["cc-pvdz-ri", "def2-svp-jkfit"]), st.one_of(BASIS_NAME, st.text(max_size=12))),
}


@st.composite
def run_options(draw):
    """Every option from its accepted values, except (mostly) one drawn from its wild values, so
    that the wild value is what the parser sees rather than an earlier refusal."""
    wild = draw(st.sampled_from([None] + list(RUN_OPTIONS)))
    args = []
    for opt, (good, bad) in RUN_OPTIONS.items():
        if opt == wild:
            args += [opt, draw(bad)]
        elif draw(st.booleans()):
            args += [opt, draw(good)]
    args += draw(st.sampled_from([[], ["--simulate"], ["--frozen-core"], ["--simulate", "--frozen-core"]]))
    return args


@pytest.mark.heavy
@FUZZ
@given(options=run_options())
def test_run_options(options):
    """Option values as typed; H2 in cc-pVDZ, so a run the options allow is over in a moment.
    (--storage disk puts B in the default scratch directory, which the run removes; the
    scratch location itself is not fuzzed here.)"""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "h2.xyz"
        p.write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
        check(["run", str(p), "-q", *options], Path(d))


# ---------------------------------------------------------------------------------------------
# compare, regress, bench
# ---------------------------------------------------------------------------------------------
SIZE = st.one_of(
    st.integers(1, 8).map(str),
    st.integers(10**4, 10**12).map(str),
    st.sampled_from(["0", "-3", "", "x", "2.5", "1e3", "9" * 40]),
)


@FUZZ
@given(
    synthetic=st.one_of(
        st.tuples(SIZE, SIZE, SIZE).map(",".join), st.lists(SIZE, max_size=4).map(",".join), st.text(max_size=12)
    ),
    seed=st.one_of(st.integers(-5, 2**64 + 5).map(str), st.sampled_from(["x", ""])),
    devices=st.sampled_from([None, "cpu", "cpu,cpu", "cpu,cuda", "cpu,trn1", "", ",", "gpu"]),
    precision=st.sampled_from(["fp64", "fp32"]),
    repeat=st.sampled_from(["1", "2", "0", "101"]),
    tol=st.sampled_from([None, "1e-8", "0", "-1", "nan", "inf", "x"]),
)
def test_compare_synthetic_options(synthetic, seed, devices, precision, repeat, tol):
    """A sizes triple of all-small or containing a huge size (refused by the memory check, never
    allocated); small triples run the pair step in milliseconds."""
    sizes = synthetic.split(",")
    if len(sizes) == 3 and all(s.isdigit() for s in sizes):
        small = [int(s) <= 8 for s in sizes]
        if not all(small) and sum(int(s) >= 10**4 for s in sizes) < 3:
            synthetic = "2,3,4"  # out of the domain: e.g. 1e4 x 1 x 1 would run (slowly)
    args = ["compare", "--synthetic", synthetic, "--seed", seed, "--precision", precision, "--repeat", repeat]
    args += ["--devices", devices] if devices is not None else []
    args += ["--tol", tol] if tol is not None else []
    with tempfile.TemporaryDirectory() as d:
        check(args, Path(d))


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
    max_leaves=12,
)


def _json_or_bytes(path: Path, doc, raw) -> Path:
    """``doc`` as JSON in ``path``, or the bytes ``raw`` when given; returns the path."""
    if raw is None:
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(raw)
    return path


@FUZZ
@given(
    doc=st.one_of(
        JSON_VALUE,
        st.dictionaries(st.sampled_from(["references", "meta"]), JSON_VALUE),
        st.builds(
            lambda e: {"references": {"w": e}},
            st.dictionaries(
                st.sampled_from(
                    [
                        "key",
                        "molecule",
                        "path",
                        "basis",
                        "auxbasis",
                        "scf_mode",
                        "subset",
                        "frozen_core",
                        "nbasis",
                        "e_corr",
                        "auxbasis_requested",
                    ]
                ),
                JSON_VALUE,
            ),
        ),
    ),
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_regress_references_file(doc, raw):
    """--references with any JSON (or bytes) and --list: listed or one error line; no case runs."""
    with tempfile.TemporaryDirectory() as d:
        p = _json_or_bytes(Path(d) / "refs.json", doc, raw)
        check(["regress", "--references", str(p), "--list"], Path(d))


@FUZZ
@given(
    doc=st.one_of(
        JSON_VALUE,
        st.builds(
            lambda m, rest: {"schema": "dfmp2-bench/1", "meta": m, **rest},
            JSON_VALUE,
            st.dictionaries(
                st.sampled_from(["devices", "ops", "shapes", "gemm_peak", "waters", "trn_estimate"]), JSON_VALUE
            ),
        ),
    ),
    raw=st.one_of(st.none(), st.binary(max_size=40)),
)
def test_bench_rerender_file(doc, raw):
    with tempfile.TemporaryDirectory() as d:
        p = _json_or_bytes(Path(d) / "r.json", doc, raw)
        check(["bench", "--rerender", str(p)], Path(d), allowed={"r.md", "r.png"})


@FUZZ
@given(
    waters=st.text(alphabet="0123456789-, none", max_size=10),
    shapes=st.text(alphabet="0123456789,;x- small", max_size=14),
)
def test_bench_series_and_shape_parsers(waters, shapes):
    """The parsers behind --waters and --shapes (the command itself would start the benchmark):
    a list, or an InputError of one line."""
    for parse, text in ((waters_mod.parse_waters, waters), (shapes_mod.parse_shapes, shapes)):
        try:
            out = parse(text)
        except InputError as e:
            assert "\n" not in str(e) and str(e)
        else:
            assert isinstance(out, list)


# ---------------------------------------------------------------------------------------------
# non-regular files as every path option
# ---------------------------------------------------------------------------------------------
H2 = "2\n\nH 0 0 0\nH 0 0 0.74\n"
SPECIAL = ("/dev/null", "/dev/zero", "/dev/full", "fifo", "directory")


@pytest.mark.heavy
@FUZZ
@given(
    option=st.sampled_from(["INPUT", "--json", "--qcschema", "--checkpoint", "--resume", "--scratch"]),
    target=st.sampled_from(SPECIAL),
    second=st.sampled_from([None, "--json"]),
)
def test_non_regular_files_as_path_options(option, target, second):
    """A device, a FIFO nobody reads or writes, or a directory, as any path: exit 0 (written
    into, as /dev/null takes a JSON), or one error line; never a traceback or a hang. A FIFO as
    the input is left out: reading one that no process writes waits, as it does for any program.
    (A second output is --json only: a failed run's --qcschema file is a FailedOperation by design.)"""
    import os

    if option == "INPUT" and target == "fifo":
        return
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        (work / "h2.xyz").write_text(H2)
        os.mkfifo(work / "fifo")
        (work / "directory").mkdir()
        path = str(work / target) if target in ("fifo", "directory") else target
        args = ["run", path if option == "INPUT" else str(work / "h2.xyz"), "-q", "--basis", "sto-3g"]
        if option != "INPUT":
            args += [option, path]
        if second and second != option:
            args += [second, str(work / "out.json")]
        before = {q.name for q in work.iterdir()}
        res = CliRunner().invoke(main, args)
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code in (0, 2) and "Traceback" not in res.output, (args, res.output, res.exc_info)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exc_info)
        if res.exit_code == 2:
            assert len(err) == 1 and err[0].startswith("error: "), (args, res.stderr)
        created = {q.name for q in work.iterdir()} - before
        assert created <= {"out.json"}, (args, created)
        if created:  # written only by a run that finished (a later output may still fail), and whole
            assert json.loads((work / "out.json").read_text())["schema_version"], args


@pytest.mark.heavy
@settings(derandomize=True, deadline=None, database=None, max_examples=6, suppress_health_check=[HealthCheck.too_slow])
@given(
    stdout=st.sampled_from(["full", "closed"]),
    command=st.sampled_from(
        [
            ["run", "H2", "--basis", "sto-3g"],
            ["run", "H2", "--basis", "sto-3g", "-v"],
            ["run", "H2", "--basis", "sto-3g", "--json", "OUT"],
            ["compare", "--synthetic", "3,10,12", "--devices", "cpu", "--json", "OUT"],
        ]
    ),
)
def test_full_and_closed_stdout(stdout, command):
    """Real processes with a full stdout (/dev/full) or a closed one (a reader gone, as `| head`):
    exit 0 (closed: the printing stops quietly) or 2 with one error line (full), never a
    traceback; a requested --json is written whole either way."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "h2.xyz").write_text(H2)
        args = [
            str(Path(d) / "h2.xyz") if a == "H2" else str(Path(d) / "out.json") if a == "OUT" else a for a in command
        ]
        env = {**os.environ, "PYTHONPATH": str(root)}
        sink = open("/dev/full", "w") if stdout == "full" else subprocess.PIPE
        try:
            p = subprocess.Popen(
                [sys.executable, "-m", "dfmp2.cli.main", *args],
                cwd=d,
                env=env,
                text=True,
                stdout=sink,
                stderr=subprocess.PIPE,
            )
            if stdout == "closed":
                p.stdout.close()
            err = p.stderr.read()
            p.wait(timeout=120)
        finally:
            if stdout == "full":
                sink.close()
        assert "Traceback" not in err and "Exception ignored" not in err, err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        if stdout == "closed":
            assert p.returncode == 0, err
        else:
            assert p.returncode == 2 and lines[-1].startswith("error: cannot write to standard output"), err
        if "OUT" in command:
            assert json.loads((Path(d) / "out.json").read_text())


@FUZZ
@given(
    size=st.sampled_from([64 * 10**6 + 1, 200 * 10**6, 4 * 1024**3]),
    suffix=st.sampled_from([".xyz", ".json"]),
    head=st.sampled_from([b"", b"3\n\nO 0 0 0\n"]),
)
def test_oversized_inputs_are_refused_unread(size, suffix, head):
    """Inputs past the read bound (sparse files up to 4 GiB on paper) are one error line, unread:
    `run /dev/zero` read until the OOM killer, a 4 GB file under an rlimit was a MemoryError
    (the rlimit itself: tests/cli/test_cli.py, in a child process)."""
    from dfmp2.io.xyz import MAX_INPUT_BYTES

    assert size > MAX_INPUT_BYTES
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"big{suffix}"
        with open(p, "wb") as f:
            f.write(head)
            f.truncate(size)
        res = check(["run", str(p), "-q"], Path(d))
        assert res.exit_code == 2 and "larger than" in res.stderr


# ---------------------------------------------------------------------------------------------
# full disks: a small tmpfs that fills while the run goes on
# ---------------------------------------------------------------------------------------------
@pytest.mark.heavy
@settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=10,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    size_kb=st.sampled_from([4, 16, 40, 72, 96, 160]),
    outputs=st.lists(
        st.sampled_from(["--checkpoint", "--scratch", "--json", "--qcschema"]), min_size=1, max_size=3, unique=True
    ),
)
def test_full_disks(tmp_path, size_kb, outputs):
    """Every path option on a tmpfs of a few kB (mounted per example; skipped where mounting is
    not permitted), with the disk check told the disk is huge, so a write fails mid-run when it
    does not fit: exit 0 with the requested files whole, or one error line with nothing left on
    that disk (a failed HDF5 close used to crash the process)."""
    import collections
    import shutil
    from unittest import mock

    from tmpfs import tmpfs

    huge = collections.namedtuple("usage", "total used free")(10**12, 0, 10**12)
    with tmpfs(tmp_path, size_kb) as disk, mock.patch.object(shutil, "disk_usage", lambda p: huge):
        files = {"--checkpoint": "ck.h5", "--json": "out.json", "--qcschema": "out.qcschema.json"}
        args = ["run", str(Path(__file__).resolve().parents[2] / "inputs" / "water.xyz"), "-q"]
        for o in outputs:
            args += [o, str(disk / files[o])] if o in files else ["--storage", "disk", "--scratch", str(disk)]
        res = CliRunner().invoke(main, args)
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.exit_code in (0, 2) and "Traceback" not in res.output, (args, res.output, res.exc_info)
        left = {p.name for p in disk.iterdir()}
        if res.exit_code == 2:
            assert len(err) == 1 and err[0].startswith("error: "), (args, res.stderr)
            if "kept in the checkpoint" in err[0]:  # an output failed after the run: its checkpoint is whole
                import h5py

                with h5py.File(disk / files["--checkpoint"], "r") as f:
                    assert int(f.attrs["complete"]) == 1, (args, err)
                left -= {files["--checkpoint"]}
            assert not left or ("--qcschema" in outputs and left == {files["--qcschema"]}), (args, left)
        else:
            assert left == {files[o] for o in outputs if o in files}, (args, left)
            for o in ("--json", "--qcschema"):
                if o in outputs:
                    assert json.loads((disk / files[o]).read_text())
