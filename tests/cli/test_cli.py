"""The command line: a good run writes table and JSON; each bad input gives one error line,
exit code 2, no traceback, and no result file."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2 import memory
from dfmp2.cli.main import main
from dfmp2.cli.options import parse_memory
from dfmp2.errors import InputError

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = "3\n{comment}\nO 0.0 0.0 0.0\nH 0.0 0.757 0.587\nH 0.0 -0.757 0.587\n"


def write(tmp_path, text, name="mol.xyz"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def run_cli(args):
    return CliRunner().invoke(main, args)


def test_run_writes_table_and_json(tmp_path):
    out = tmp_path / "water.json"
    res = run_cli(["run", str(INPUTS / "water.xyz"), "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert "E(MP2)" in res.output and "Eh" in res.output
    d = json.loads(out.read_text())
    assert d["ran"]["device"] == "cpu" and d["ran"]["precision"] == "fp64"
    assert d["energies"]["e_corr"] < -0.1
    assert d["versions"]["pyscf"]
    rss = d["peak_rss_mb"]  # the high-water mark when each stage last ended, MB, interpreter included
    assert list(rss) == list(d["timings"]) and d["units"]["peak_rss_mb"] == "MB"
    assert 50 < min(rss.values()) and rss["pair"] == max(rss.values())  # the pair step ends last
    # what the process held when the plan was made, outside the limit: below the run's peak (in
    # process here, so the test session's imports count too); how freed heap memory went back
    assert 50 < d["memory"]["process_mb"] <= max(rss.values())
    assert d["memory"]["allocator"] == memory.allocator() and "malloc" in d["memory"]["allocator"]


BAD_XYZ = {
    "bad count line": ("three\nwater\nO 0 0 0\n", [":1:", "atom count"]),
    "non-numeric coordinate": (WATER.format(comment="x").replace("0.757", "0.7x7"), [":4:", "numbers"]),
    "missing column": ("2\n\nH 0 0 0\nH 0 0\n", [":4:", "symbol x y z"]),
    "unknown element": ("2\n\nH 0 0 0\nQq 0 0 0.74\n", [":4:", "unknown element 'Qq'"]),
    "atom count mismatch": ("4\n\nH 0 0 0\nH 0 0 0.74\n", ["atom count mismatch", "4 atoms", "found 2"]),
    "odd electrons as a singlet": (
        "1\nmultiplicity=1\nH 0 0 0\n",
        ["1 electrons cannot have multiplicity 1", "odd electron count needs an even"],
    ),
    "multiplicity 2 in comment": (WATER.format(comment="multiplicity=2"), ["10 electrons cannot have multiplicity 2"]),
    "multiplicity beyond the electrons": (
        WATER.format(comment="multiplicity=13"),
        ["multiplicity 13 needs 12 unpaired electrons", "only 10"],
    ),
    "empty file": ("", [":1:"]),
    # nothing is guessed at or truncated
    "extra column (atomic number)": ("1\n\nO 8 0.0 0.0 0.119\n", [":3:", "5 fields", "extra columns"]),
    "extra column on line 5": (
        WATER.format(comment="").replace("H 0.0 -0.757 0.587", "H 0.0 -0.757 0.587 0.1"),
        [":5:", "5 fields"],
    ),
    "non-integer charge": (WATER.format(comment="charge=2.5"), [":2:", "charge must be an integer", "'2.5'"]),
    "non-integer multiplicity": (
        WATER.format(comment="charge=0 multiplicity=1.0"),
        [":2:", "multiplicity must be an integer"],
    ),
    "multiplicity 0": (WATER.format(comment="multiplicity=0"), [":2:", "multiplicity must be 1 or more"]),
    "nan coordinate": (WATER.format(comment="").replace("0.757", "nan", 1), [":4:", "finite"]),
    "inf coordinate": (WATER.format(comment="").replace("0.587", "-inf", 1), [":4:", "finite"]),
    "overflowing coordinate": (WATER.format(comment="").replace("0.587", "1e400", 1), [":4:", "finite"]),
    "absurd coordinate": (WATER.format(comment="").replace("0.587", "1e200", 1), [":4:", "within"]),
    "underscore in a number": (WATER.format(comment="").replace("0.757", "0_757", 1), [":4:", "numbers"]),
    "huge atom count": ("123456789\n\nH 0 0 0\n", ["123456789 atoms", "found 1"]),
    "atom count beyond reason": ("9" * 5000 + "\n\nH 0 0 0\n", [":1:", "atom count"]),
    "binary junk": ("\x00\x01\x02\x7f\n\x00\n", [":1:", "atom count", "\\x00"]),
    "superscript digit as element": ("1\n\n\u00b2 0 0 0\n", [":3:", "unknown element"]),
    # the comment line's keys are read once, and none is ignored silently
    "charge given twice": (WATER.format(comment="charge=1 charge=-1"), [":2:", "charge is given 2 times"]),
    "multiplicity given twice": (
        WATER.format(comment="mult=1 multiplicity=3"),
        [":2:", "multiplicity is given 2 times"],
    ),
    "spin key": (WATER.format(comment="spin=2"), [":2:", "'spin=' is not read", "multiplicity=2S+1"]),
    "misspelt charge": (WATER.format(comment="chrage=1"), [":2:", "unknown key 'chrage='", "'charge='"]),
    "charge out of range": (WATER.format(comment="charge=1000000"), [":2:", "charge 1000000 is out of range"]),
    "multiplicity out of range": (WATER.format(comment="multiplicity=" + "9" * 40), [":2:", "out of range"]),
}


@pytest.mark.parametrize("case", sorted(BAD_XYZ))
def test_bad_xyz(tmp_path, case):
    text, fragments = BAD_XYZ[case]
    out = tmp_path / "out.json"
    res = run_cli(["run", write(tmp_path, text), "--json", str(out)])
    assert_one_line_error(res, *fragments)
    assert not out.exists()


def test_non_utf8_file(tmp_path):
    p = tmp_path / "mol.xyz"
    p.write_bytes(b"1\n\xff\xfe comment\nH 0 0 0\n")
    assert_one_line_error(run_cli(["run", str(p)]), "not a text file", "UTF-8")


def test_missing_file(tmp_path):
    assert_one_line_error(run_cli(["run", str(tmp_path / "nope.xyz")]), "no such file")


def test_devices_are_refused_without_reading_them():
    """`dfmp2 run /dev/zero` read until the OOM killer came."""
    for dev in ("/dev/zero", "/dev/urandom"):
        assert_one_line_error(run_cli(["run", dev]), f"{dev}: is a character device, not a file")


@pytest.mark.heavy
def test_inputs_larger_than_the_bound_are_refused_unread(tmp_path):
    from dfmp2.io import xyz

    big = tmp_path / "big.xyz"
    with open(big, "wb") as f:  # sparse: 4 GB on paper, nothing on disk
        f.truncate(4 * 1024**3)
    import resource

    # as in the issue: under a 3 GB address-space limit the whole read was a MemoryError traceback
    p = subprocess.run(
        [sys.executable, "-m", "dfmp2.cli.main", "run", str(big)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (3 << 30,) * 2),
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert (
        p.stderr.strip().splitlines()[-1] == f"error: {big}: larger than 64 MB, far more than any "
        "molecule; expected an .xyz file"
    )
    big.rename(big.with_suffix(".json"))
    assert_one_line_error(run_cli(["run", str(big.with_suffix(".json"))]), "larger than 64 MB")
    with pytest.raises(InputError, match="larger than 1e-05 MB"):  # a FIFO's bound is on what is read
        xyz.read_input_text(write(tmp_path, WATER.format(comment="")), "an .xyz file", max_bytes=10)


def test_fifo_input_is_read(tmp_path):
    import os
    import threading

    fifo = tmp_path / "mol.xyz"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(WATER.format(comment="")))
    writer.start()
    from dfmp2.io.xyz import read_xyz

    assert read_xyz(fifo).natm == 3
    writer.join()


def test_byte_order_mark_and_free_text_comments_are_read(tmp_path):
    p = tmp_path / "bom.xyz"
    p.write_bytes(b"\xef\xbb\xbf" + WATER.format(comment='water charge=0 energy=-76.4 Lattice="1 0 0"').encode())
    from dfmp2.io.xyz import read_xyz

    g = read_xyz(p)
    assert g.natm == 3 and g.charge == 0 and g.comment.startswith("water")
    assert read_xyz(write(tmp_path, WATER.format(comment="charge=-000001"))).charge == -1


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--json", ""], "--json: the path is empty"),
        (["--qcschema", ""], "--qcschema: the path is empty"),
        (["--basis", "cc-pv\ndz"], "must be a basis set name (one printable line), got 'cc-pv\\ndz'"),
    ],
)
def test_empty_output_paths_and_newlines_are_one_line(tmp_path, args, fragment):
    res = run_cli(["run", str(INPUTS / "water.xyz")] + args)
    assert_one_line_error(res, fragment)


def test_empty_and_newline_input_paths(tmp_path):
    assert_one_line_error(run_cli(["run", ""]), "the input path is empty")
    assert_one_line_error(run_cli(["run", str(tmp_path / "a\nb.xyz")]), "a\\nb.xyz: no such file")


def test_charge_option_makes_odd(tmp_path):
    assert_one_line_error(
        run_cli(["run", write(tmp_path, WATER.format(comment="")), "--charge", "1", "--multiplicity", "1"]),
        "9 electrons cannot have multiplicity 1",
    )


def test_basis_missing_for_element(tmp_path):
    res = run_cli(["run", write(tmp_path, "2\n\nI 0 0 0\nI 0 0 2.67\n")])
    assert_one_line_error(res, "basis 'cc-pvdz' is not defined for I", "--basis")


def test_auxbasis_missing_for_element(tmp_path):
    res = run_cli(
        ["run", write(tmp_path, "2\n\nK 0 0 0\nH 0 0 2.24\n"), "--basis", "def2-svp", "--auxbasis", "cc-pvdz-ri"]
    )
    assert_one_line_error(res, "auxiliary basis 'cc-pvdz-ri' is not defined for K", "--auxbasis")


def test_scf_not_converged(tmp_path):
    out = tmp_path / "out.json"
    res = run_cli(["run", str(INPUTS / "water.xyz"), "--json", str(out), "--scf-max-cycle", "2"])
    assert_one_line_error(res, "RHF did not converge in 2 cycles")
    assert not out.exists()


def test_memory_limit_checked_before_scf(tmp_path, no_scf):
    res = run_cli(["run", str(INPUTS / "water.xyz"), "--memory", "0.1MB"])
    assert_one_line_error(res, "needs at least", "--memory")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--device", "cuda"], "no CUDA GPU"),
        (["--device", "trn1"], "Neuron SDK"),
        (["--device", "tpu"], "unknown device 'tpu'"),
        (["--simulate"], "simulation applies only to trn1/trn2"),
        (["--device", "trn2", "--simulate", "--precision", "fp64"], "no fp64"),
        (["--memory", "lots"], "(--memory)"),
        (["--memory", "nan"], "memory limit must be a finite size"),
        (["--memory", "inf"], "memory limit must be a finite size"),
        (["--memory", "1e400"], "memory limit must be a finite size"),
        (["--memory", "infGB"], "memory limit must be a finite size"),
        (["--memory", "4_000"], "cannot read the memory limit '4_000'"),
    ],
)
def test_device_and_option_errors(args, fragment, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # "no CUDA GPU" on any machine
    res = run_cli(["run", str(INPUTS / "water.xyz")] + args)
    assert_one_line_error(res, fragment)


def test_parse_memory():
    assert parse_memory("4GB") == 4000 and parse_memory("512") == 512
    assert parse_memory("1GiB") == pytest.approx(1073.741824)
    assert parse_memory("1TB") == parse_memory("1T") == parse_memory("1 tb") == 1e6
    assert parse_memory("1TiB") == pytest.approx(1099511.627776)
    for bad in ("-1GB", "nan", "-inf", "1e400", "1e400MB", "NaNGiB"):
        with pytest.raises(InputError):
            parse_memory(bad)


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["run", "x.xyz", "--precision", "fp16"], "Invalid value for '--precision'"),
        (["run"], "Missing argument 'INPUT'"),
        (["run", "x.xyz", "--no-such-option"], "--no-such-option"),
        (["run", "x.xyz", "--charge", "2.5"], "'--charge'"),
        (["rn"], "No such command 'rn'"),
        (["compare", "--synthetic", "2,3,4", "--seed", "-1"], "'--seed'"),
        (["bench", "--threads", "0"], "'--threads'"),
    ],
)
def test_usage_errors_are_one_line(args, fragment):
    """Click's usage block (Usage:, Try ..., Error:) becomes one error line naming the help."""
    res = run_cli(args)
    assert_one_line_error(res, fragment, "--help")
    assert "Usage:" not in res.output


def test_help_and_version_still_exit_0():
    assert run_cli(["--version"]).exit_code == 0
    res = run_cli(["run", "--help"])
    assert res.exit_code == 0 and "Usage:" in res.output and "error" not in res.output


def test_quiet_prints_only_the_energies_table(tmp_path):
    loud = run_cli(["run", str(INPUTS / "water.xyz")])
    quiet = run_cli(["run", str(INPUTS / "water.xyz"), "-q"])
    assert loud.exit_code == quiet.exit_code == 0, (loud.output, quiet.output)
    assert "problem and what ran" in loud.output and "problem and what ran" not in quiet.output
    assert "E(MP2)" in quiet.output and "kernels" not in quiet.output
    assert quiet.stderr == ""
    assert "GF/s" not in loud.output  # only -v adds each stage's rate


def test_verbose_adds_each_stage_rate():
    res = run_cli(["run", str(INPUTS / "water.xyz"), "--basis", "sto-3g", "-v"])
    assert res.exit_code == 0, res.output
    assert "GF/s (linalg flops / s)" in res.output and "whole run" in res.output
    # the plan's table and the memory row show what the process held outside the limit
    assert "resident before" in res.output and "resident before; process peak RSS" in res.output


@pytest.mark.heavy
def test_pyscf_basis_set_exchange_warning_does_not_reach_the_user(tmp_path):
    """PySCF warns 'Basis may be available in basis-set-exchange ... pip install' whenever a basis
    lacks an element (here cc-pVDZ for I, and the MP2-fit lookup); the user gets our error line
    only, in a real process (where Python shows warnings on stderr)."""
    p = subprocess.run(
        [sys.executable, "-m", "dfmp2.cli.main", "run", write(tmp_path, "2\n\nI 0 0 0\nI 0 0 2.67\n")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "error: basis 'cc-pvdz' is not defined for I; choose another basis (--basis)"
    ], p.stderr


@pytest.mark.heavy
def test_real_process_error_has_no_traceback(tmp_path):
    """The installed entry point, as a user runs it: stderr has one line, exit code 2."""
    p = subprocess.run(
        [sys.executable, "-m", "dfmp2.cli.main", "run", write(tmp_path, "2\n\nH 0 0 0\nXx 0 0 1\n")],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [f"error: {tmp_path / 'mol.xyz'}:4: unknown element 'Xx'"]


def test_every_command_offers_every_scf_mode():
    """run, interaction and compare take the same --scf choices as dfmp2.scf.pyscf_scf.SCF_MODES (the
    interaction command once lagged behind when pyscf-df was added)."""
    from dfmp2.scf import pyscf_scf

    for name in ("run", "interaction", "compare"):
        opt = next(p for p in main.commands[name].params if p.name == "scf_mode")
        assert tuple(opt.type.choices) == pyscf_scf.SCF_MODES, name


def test_compare_synthetic_refuses_a_launcher(monkeypatch):
    """Started by a launcher with several processes, compare --synthetic (a pair step of seconds,
    timed: not dealt to ranks) is refused before any work, saying why and which commands use
    ranks: rank 0 one error line, the other ranks exit 2 quietly. (compare of a molecule and
    regress deal their runs: tests/system/test_distributed_compare_regress.py.)"""
    args = ["compare", "--synthetic", "4,20,30", "--devices", "cpu"]
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    res = run_cli(args)
    assert res.exit_code == 2 and "dfmp2 compare --synthetic runs in one process (its pair step" in res.output
    assert "regress and compare of a molecule use several ranks" in res.output
    monkeypatch.setenv("RANK", "1")
    res = run_cli(args)
    assert res.exit_code == 2 and "error" not in res.output
