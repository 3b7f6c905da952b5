"""Fuzzing the Python API: keyword values of wrong types and ranges for
``dfmp2.energy``, and PySCF Mole attributes, raise only dfmp2's errors, one line each, or run.

The property, for every input: the call returns a Result, or raises an ``InputError`` (or linalg's
``DeviceUnavailableError``) whose message is one line and names no CLI flag; never a TypeError,
ValueError or any other exception from inside PySCF or torch. Runs that would reach an SCF stop at
the memory plan (``memory_mb`` far below need), except the Mole fuzz, whose molecules are tiny.
"""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyscf import gto

import dfmp2
from dfmp2.errors import InputError
from dfmp2.linalg import DeviceUnavailableError
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
WATER = "inputs/water.xyz"
REFUSED_MEMORY = 0.001  # MB: below any plan, so a run that passes every check stops before the SCF

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**7), 10**7),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
FIELDS = [f for f in RunOptions.__dataclass_fields__ if f not in ("memory_mb", "checkpoint", "resume", "scratch_dir")]


def check_call(fn):
    """Run ``fn()``; assert the property; return the Result or the error."""
    try:
        return fn()
    except (InputError, DeviceUnavailableError) as e:
        msg = str(e)
        assert msg and "\n" not in msg and " --" not in msg, msg
        return e


@FUZZ
@given(field=st.sampled_from(FIELDS), value=ANY)
def test_energy_keywords_of_any_type_raise_only_dfmp2_errors(tmp_path_factory, field, value):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    check_call(lambda: dfmp2.energy(str(root / WATER), memory_mb=REFUSED_MEMORY, **{field: value}))


@FUZZ
@given(memory=ANY)
def test_memory_of_any_type_raises_only_dfmp2_errors(memory):
    out = check_call(lambda: RunOptions(memory_mb=memory))
    if isinstance(out, RunOptions):
        assert memory is None or (math.isfinite(memory) and memory > 0)


@FUZZ
@given(
    cart=st.booleans(),
    nucmod=st.sampled_from([{}, "G", {"H": "G"}]),
    charge=st.integers(-3, 3),
    spin=st.integers(0, 3),
    basis=st.sampled_from(["sto-3g", "6-31g", "cc-pvdz", {"H": "sto-3g", "Li": "sto-3g"}, "no-such-basis"]),
    unit=st.sampled_from(["Angstrom", "Bohr"]),
)
def test_mole_attributes_are_honoured_or_refused(cart, nucmod, charge, spin, basis, unit):
    """A Mole that PySCF itself refuses to build is not ours to judge; any Mole it builds gives a
    Result or one dfmp2 error (cart and nucmod are refused by energy(mol): DFMP2(mf) honours them)."""
    try:
        mol = gto.M(
            atom="Li 0 0 0; H 0 0 1.6",
            basis=basis,
            charge=charge,
            spin=spin,
            cart=cart,
            nucmod=nucmod,
            unit=unit,
            verbose=0,
        )
    except Exception:  # PySCF's own refusal (odd electrons for a spin, unknown basis)
        return
    out = check_call(lambda: dfmp2.energy(mol))
    if cart or nucmod:
        assert isinstance(out, InputError) and "cannot carry the Mole's" in str(out)
