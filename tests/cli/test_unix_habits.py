"""Unix habits (issue 61): INPUT '-' reads standard input, an output '-' (or /dev/stdout) is
standard output and then holds that document alone (the tables go to stderr), nothing folds in a
file or pipe, and optimize never replaces an earlier run's files at its default paths silently."""

import io
import json
import subprocess
import sys

import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.cli.options import report_console, stdout_console
from dfmp2.io.outputs import check_output_file, is_stdout

H2 = "2\nhydrogen\nH 0 0 0\nH 0 0 0.74\n"
NE = "1\nneon\nNe 0 0 0\n"


@pytest.mark.parametrize("quiet", [["-q"], []], ids=["quiet", "loud"])
def test_stdin_in_json_out_and_nothing_else_on_stdout(quiet, tmp_path):
    r = CliRunner().invoke(main, ["run", "-", "--basis", "sto-3g", "--json", "-", *quiet], input=H2)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # the whole of stdout is the document
    assert doc["molecule"] == "stdin" and doc["natm"] == 2
    assert "E(MP2)" in r.stderr and "(stdin)" in r.stderr  # the table, on stderr
    assert not (tmp_path / "-").exists()
    f = tmp_path / "h2.xyz"
    f.write_text(H2)
    from_file = CliRunner().invoke(main, ["run", str(f), "--basis", "sto-3g", "--json", str(tmp_path / "h2.json")])
    assert from_file.exit_code == 0, from_file.output
    e_file = json.loads((tmp_path / "h2.json").read_text())["energies"]["e_mp2"]
    assert e_file == pytest.approx(doc["energies"]["e_mp2"], abs=1e-12)


def test_dev_stdout_counts_as_standard_output(tmp_path, monkeypatch):
    out = tmp_path / "redirected.txt"
    with open(out, "w") as f:
        monkeypatch.setattr(sys, "stdout", f)
        assert is_stdout("-") and is_stdout(str(out)) and is_stdout(f"/proc/self/fd/{f.fileno()}")
        assert not is_stdout("/dev/null") and not is_stdout(str(tmp_path / "other.json")) and not is_stdout(None)
        assert stdout_console(str(out)).stderr and not stdout_console(str(tmp_path / "x.json")).stderr
    assert_one_line_error(
        CliRunner().invoke(main, ["run", "-", "--json", "-", "--qcschema", "-"], input=H2), "standard output"
    )
    with pytest.raises(Exception, match="both go to standard output"):
        check_output_file("-", "--qcschema", not_same_as=[("--json", "-"), ("input", "-")])


@pytest.mark.heavy
def test_json_to_dev_stdout_in_a_pipe_is_json_alone(tmp_path):
    src = tmp_path / "h2.xyz"
    src.write_text(H2)
    for args in (["-q"], []):
        cmd = [sys.executable, "-m", "dfmp2", "run", str(src), "--basis", "sto-3g", "--json", "/dev/stdout", *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["natm"] == 2 and "E(MP2)" in r.stderr
    piped = subprocess.run(
        f"cat {src} | {sys.executable} -m dfmp2 run - --basis sto-3g --json - -q | {sys.executable} -m json.tool",
        shell=True,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert piped.returncode == 0 and json.loads(piped.stdout)["molecule"] == "stdin", piped.stderr


def test_nothing_folds_in_a_file_or_pipe(tmp_path):
    from rich.table import Table

    buf = io.StringIO()
    console = report_console(file=buf)  # a StringIO is no terminal
    t = Table(title="title " + "t" * 150)
    t.add_column("a")
    t.add_row("cell " + "c" * 150)
    t.caption = "caption " + "x" * 300
    console.print(t)
    console.print("[dim]a log line " + "y" * 300 + "[/dim]")
    lines = buf.getvalue().splitlines()
    for whole in ("title " + "t" * 150, "caption " + "x" * 300, "a log line " + "y" * 300, "cell " + "c" * 150):
        assert any(whole in ln for ln in lines), whole
    deep = tmp_path / ("a_long_directory_name_" * 8)
    deep.mkdir()
    (deep / "h2.xyz").write_text(H2)
    r = CliRunner().invoke(main, ["run", str(deep / "h2.xyz"), "--basis", "sto-3g"])
    assert r.exit_code == 0, r.output
    assert any(str(deep / "h2.xyz") in ln for ln in r.stdout.splitlines())  # the title: one line


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["optimize", "-"], "give -o"),
        (["optimize", "-", "-o", "-"], "--trajectory"),
        (["optimize", "-", "-o", "n.xyz", "--trajectory", "-"], "rewritten after every step"),
        (["optimize", "-", "-o", "-", "--trajectory", "t.xyz", "--json", "-"], "standard output"),
        (["frequencies", "-", "--checkpoint", "-"], "give it a file"),
    ],
)
def test_outputs_that_cannot_be_standard_output(args, fragment, tmp_path, monkeypatch):
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(CliRunner().invoke(main, [*args, "--basis", "6-31g"], input=NE), fragment)
    assert list(tmp_path.iterdir()) == []


def test_optimize_from_stdin_to_stdout(tmp_path, monkeypatch):
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(
        main, ["optimize", "-", "--basis", "6-31g", "-o", "-", "--trajectory", "ne.traj.xyz"], input=NE
    )
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()  # the final XYZ alone
    assert lines[0].strip() == "1" and lines[2].split()[0] == "Ne" and len(lines) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ne.traj.xyz"]


def test_optimize_keeps_an_earlier_runs_files_at_default_paths(tmp_path, monkeypatch):
    """A default path (from INPUT's name) that exists is one error line naming it and --overwrite;
    a path the user names is replaced, as -o and --json are everywhere."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ne.xyz").write_text(NE)
    (tmp_path / "ne.traj.xyz").write_text("earlier\n")
    run = ["optimize", "ne.xyz", "--basis", "6-31g", "-q"]
    assert_one_line_error(CliRunner().invoke(main, run), "ne.traj.xyz exists", "--overwrite")
    assert (tmp_path / "ne.traj.xyz").read_text() == "earlier\n" and not (tmp_path / "ne.opt.xyz").exists()
    r = CliRunner().invoke(main, [*run, "--trajectory", "ne.traj.xyz"])  # named: replaced
    assert r.exit_code == 0, r.output
    assert (tmp_path / "ne.traj.xyz").read_text() != "earlier\n"
    assert_one_line_error(CliRunner().invoke(main, run), "ne.opt.xyz exists", "--overwrite")
    r = CliRunner().invoke(main, [*run, "--overwrite"])
    assert r.exit_code == 0, r.output
