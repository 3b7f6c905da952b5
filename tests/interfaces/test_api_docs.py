"""``help(dfmp2.energy)`` (and gradient, frequencies) documents every keyword option: each
RunOptions field (read from the dataclass, not listed here) has an entry with its default, and
the default it states is RunOptions'. The docstrings listed no option before."""

import dataclasses
import re

import pytest

import dfmp2
from dfmp2.options import RunOptions


def stated(value) -> str:
    """A default as the docstring states it."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@pytest.mark.parametrize("name", ["energy", "gradient", "frequencies"])
def test_every_run_option_is_documented_with_its_default(name):
    doc = getattr(dfmp2, name).__doc__
    defaults = RunOptions()
    missing, wrong = [], []
    for field in dataclasses.fields(RunOptions):
        # an entry: the name at the start of a line, then its text up to its [default: ...]
        m = re.search(rf"^\s+{field.name}: (.*?)\[default: ([^\]]*)\]", doc, re.M | re.S)
        if m is None:
            missing.append(field.name)
            continue
        default = getattr(defaults, field.name)
        if not m.group(2).startswith(stated(default)):
            wrong.append(f"{field.name}: says {m.group(2)!r}, RunOptions has {default!r}")
    assert not missing, f"help(dfmp2.{name}) lacks {', '.join(missing)}"
    assert not wrong, "; ".join(wrong)


def test_the_units_of_the_numeric_options_are_stated():
    doc = dfmp2.energy.__doc__
    for field, unit in (("memory_mb", "MB"), ("j3c_block_mb", "MB"), ("scf_screen", "Hartree^1/2"), ("charge", "e")):
        entry = re.search(rf"^\s+{field}: (.*?)\[default", doc, re.M | re.S).group(1)
        assert unit in entry, (field, entry)
