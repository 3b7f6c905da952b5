"""Every flag dfmp2's messages name exists: the '--flag' words in the source's strings (error
lines, hints, help), the flags the error lines derive from an error's ``option``
(``dfmp2.errors.flag``: every ``option=`` in the source, the checkpoint's option keys, FLAGS and
OPTION_HINTS) are each an option of some ``dfmp2`` command (or an argument's name)."""

import ast
import re
from pathlib import Path

import click

from dfmp2.cli.main import main
from dfmp2.errors import FLAGS, OPTION_HINTS, flag
from dfmp2.io.checkpoint import OPTION_KEYS

PKG = Path(__file__).resolve().parents[2] / "dfmp2"
FLAG_RE = re.compile(r"(?<![\w-])--[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# flags of other programs that messages quote (torchrun's), and the benchmark scripts' argparse options
FOREIGN = {"--nproc-per-node", "--standalone", "--baseline-timeout", "--peak-sizes", "--child"}
# option names of the Python interfaces only (ASE's and QCEngine's thread count): no CLI flag to name
API_ONLY = {"num_threads"}


def _cli_names() -> set:
    names = set()

    def walk(cmd):
        if isinstance(cmd, click.Group):
            for c in cmd.commands.values():
                walk(c)
        for p in cmd.params:
            names.update([*p.opts, *p.secondary_opts])
            if isinstance(p, click.Argument):
                names.add(p.human_readable_name)

    walk(main)
    return names | {"--help", "--version", "-h"}


def _sources():
    for f in sorted(PKG.rglob("*.py")):
        yield f, ast.parse(f.read_text())


def _string_flags() -> dict:
    found = {}
    for f, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in FLAG_RE.findall(node.value):
                    found.setdefault(m, []).append(f"{f.relative_to(PKG.parent)}:{node.lineno}")
    return found


def _option_names() -> dict:
    found = {}
    for f, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.keyword) and node.arg == "option":
                v = node.value
                for c in [v] if isinstance(v, ast.Constant) else getattr(v, "elts", []):
                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                        found.setdefault(c.value, []).append(f"{f.relative_to(PKG.parent)}:{node.lineno}")
    for k in OPTION_KEYS:
        found.setdefault(k, []).append("dfmp2/io/checkpoint.py OPTION_KEYS")
    for k in FLAGS:
        found.setdefault(k, []).append("dfmp2/errors.py FLAGS")
    return found


def test_flags_named_in_strings_exist():
    names = _cli_names()
    missing = {k: v[:3] for k, v in _string_flags().items() if k not in names and k not in FOREIGN}
    assert not missing, missing


def test_flags_of_error_options_exist():
    names = _cli_names()
    missing = {}
    for option, where in _option_names().items():
        if option in API_ONLY:
            continue
        if not all(part in names for part in flag(option).split("/")):
            missing[f"{option} -> {flag(option)}"] = where[:3]
    for hint in OPTION_HINTS.values():
        if hint.split()[0] not in names:
            missing[hint] = ["dfmp2/errors.py OPTION_HINTS"]
    assert not missing, missing


def test_the_check_sees_a_flag_that_does_not_exist():
    assert "--no-such-flag" not in _cli_names() and FLAG_RE.findall("use --no-such-flag 3") == ["--no-such-flag"]
