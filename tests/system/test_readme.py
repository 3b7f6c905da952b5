"""The README's job blocks run as written.

Every fenced block right after the marker ``<!-- jobs: tested by tests/system/test_readme.py -->``
is a job block: in a ``bash`` block each line that starts with ``dfmp2 `` runs through the
console script's click group (``dfmp2.cli.main:main``) in this process (click's CliRunner: the
same command and options, without paying torch's and PySCF's imports once per line); a ``python``
block is exec'd as it stands. Both run in a temporary directory that holds a link to the repository's ``inputs/``, so
the README's relative paths resolve and nothing is written into the checkout. A command or a
Python form that fails (a wrong option, a renamed function) fails this test; so does a README
that has lost its job blocks.
"""

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- jobs: tested by tests/system/test_readme.py -->"
BLOCK = re.compile(re.escape(MARKER) + r"\s*\n```(\w+)\n(.*?)```", re.S)
JOBS = 5  # energy, gradient/optimisation, interaction, PySCF drop-in, ASE/QCEngine


def job_blocks():
    """(language, code) of every marked block, in README order."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = BLOCK.findall(text)
    assert text.count(MARKER) == len(blocks), "a job marker is not followed by a fenced block"
    return blocks


def shell_commands():
    commands = []
    for lang, code in job_blocks():
        if lang == "bash":
            for line in code.splitlines():
                line = line.split(" #", 1)[0].strip()
                if line.startswith("dfmp2 "):
                    commands.append(line)
    return commands


def python_blocks():
    return [code for lang, code in job_blocks() if lang == "python"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    (tmp_path / "inputs").symlink_to(ROOT / "inputs", target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_readme_has_the_five_jobs_in_at_most_200_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200  # the front door; the manual is docs/
    blocks = job_blocks()
    assert [lang for lang, _ in blocks].count("bash") == JOBS, blocks
    assert len(python_blocks()) == JOBS
    assert all(any(line.startswith("dfmp2 ") for line in code.splitlines()) for lang, code in blocks if lang == "bash")


def test_readme_shell_commands_run(workdir):
    """Every `dfmp2 ...` line of the job blocks exits 0 and writes the files it names."""
    from click.testing import CliRunner

    from dfmp2.cli.main import main

    commands = shell_commands()
    assert commands
    failed = []
    for command in commands:
        result = CliRunner().invoke(main, shlex.split(command)[1:], catch_exceptions=True)
        if result.exit_code != 0:
            failed.append(f"$ {command}\nexit {result.exit_code}\n{result.output[-2000:]}\n{result.exception!r}")
    assert not failed, "\n\n".join(failed)
    for name in ("water.json", "grad.json", "water.opt.xyz", "water.qcschema.json"):
        if any(name in c for c in commands):
            assert (workdir / name).stat().st_size > 0, name


@pytest.mark.parametrize("index", range(JOBS))
def test_readme_python_forms_run(index, workdir):
    blocks = python_blocks()
    assert index < len(blocks), f"the README has {len(blocks)} job Python blocks, not {JOBS}"
    code = blocks[index]
    for module in ("ase", "qcengine", "geometric"):
        if re.search(rf"^\s*(import|from) {module}\b", code, re.M):
            pytest.importorskip(module)
    exec(compile(code, f"README.md (job {index + 1})", "exec"), {"__name__": "__readme__"})
