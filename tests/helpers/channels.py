"""Marks for the test channels (tests/conftest.py): ``heavy_cases`` puts some cases of a
parametrized test in the heavy channel and leaves the others in the default one."""

import pytest


def heavy_cases(cases, heavy) -> list:
    """``cases`` for ``pytest.mark.parametrize``, those in ``heavy`` marked heavy (run with --heavy;
    .ci/run runs them)."""
    missing = set(heavy) - set(cases)
    assert not missing, f"heavy cases not among the cases: {sorted(missing)}"
    return [pytest.param(c, marks=pytest.mark.heavy) if c in heavy else c for c in cases]
