"""``dfmp2 --help`` and ``dfmp2 --version`` answer without importing torch or PySCF: the group
(dfmp2.cli.main) loads a command's module only when that command runs, and lists the commands
from their summaries, which must be the commands' own first sentences."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from dfmp2.cli.main import COMMANDS, LazyGroup, main

HEAVY = ("torch", "pyscf", "numpy", "scipy", "h5py")

# `python -m dfmp2 ARGS` in this process (runpy, as the interpreter runs it), then the heavy
# modules that got imported, as the last line
PROBE = """
import runpy, sys
sys.argv = ["dfmp2", *sys.argv[1:]]
try:
    runpy.run_module("dfmp2", run_name="__main__")
except SystemExit as e:
    code = e.code
print(code, sorted(m for m in sys.modules if m.split(".")[0] in {heavy!r}))
"""


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"], []])
def test_help_and_version_import_neither_torch_nor_pyscf(args):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=set(HEAVY)), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "100"},
    )
    assert proc.returncode == 0, proc.stderr
    *text, last = proc.stdout.strip().split("\n")
    code, loaded = last.split(" ", 1)
    assert loaded == "[]", loaded
    if args == ["--version"]:
        assert code == "0" and "version" in text[0], proc.stdout
    else:  # bare 'dfmp2' is the help too, on stderr (click's exit 2 for no command)
        shown = "\n".join(text) if args else proc.stderr
        assert code == ("2" if not args else "0") and "Commands:" in shown, proc.stdout + proc.stderr
        assert all(f"  {name} " in shown for name in COMMANDS), shown


def test_the_summaries_are_the_commands_own_first_sentences():
    for name, (_, _, summary) in COMMANDS.items():
        assert main.commands[name].get_short_help_str(10**6) == summary, name
    assert set(main.commands) == set(COMMANDS)


@pytest.mark.parametrize("width", [60, 80, 200])
def test_the_help_lists_the_same_text_before_and_after_loading(width):
    """A fresh group (nothing loaded) prints the help the loaded one prints, at any width."""
    fresh = LazyGroup(
        name="main", lazy=COMMANDS, help=main.help, params=main.params, context_settings=main.context_settings
    )
    assert not fresh._commands
    before = CliRunner().invoke(fresh, ["--help"], terminal_width=width)
    main.commands  # noqa: B018 (reading the property loads every command)
    after = CliRunner().invoke(main, ["--help"], terminal_width=width)
    assert before.exit_code == after.exit_code == 0
    assert before.output == after.output and "Commands:" in after.output
    assert not fresh._commands  # the help loaded nothing
