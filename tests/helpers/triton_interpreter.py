"""Running Triton-kernel tests on the CPU through Triton's interpreter, in any pytest session
(a helper module: ``from triton_interpreter import interpreted``; pyproject's pytest
``pythonpath`` puts tests/helpers/ on sys.path, the tests themselves are in
tests/kernels/test_triton_interpreter.py).

Triton fixes whether a process interprets (TRITON_INTERPRET=1) when triton.language is first
imported: its own library functions (tl.zeros, tl.sum, ...) are built then. A pytest session that
also compiles kernels for a GPU (the cuda channel), or that imported triton earlier, therefore
cannot switch to the interpreter in-process. Tests decorated with ``@interpreted`` run in-process
when this process already interprets; otherwise the first of them starts ONE child pytest with
TRITON_INTERPRET=1 over all the interpreter test files, and each test reports the outcome of its
own run there (passed, failed with the child's message, or skipped with its reason).
"""

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

HELPERS = Path(__file__).resolve().parent
TESTS = HELPERS.parent
ROOT = TESTS.parent
# The modules whose @interpreted tests the child runs (one child for all of them), under tests/.
INTERPRETER_MODULES = (
    "kernels/test_triton_pair_energy.py",
    "kernels/test_triton_backend.py",
    "linalg/test_cuda_pair_path.py",
)
CHILD_TIMEOUT_S = 900


def in_interpreter() -> bool:
    """This process interprets Triton: TRITON_INTERPRET=1 and triton (if imported) was imported so."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("1", "true", "True"):
        return False
    if "triton.language" not in sys.modules:
        return True
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(tl.zeros, InterpretedFunction)


def _runtime_loop_probe(out_ptr, n):
    """A kernel with a loop over a runtime bound, as the fused pair kernel has (jitted by _probe)."""
    import triton.language as tl

    acc = 0
    for i in range(0, n, 1):
        acc += i
    tl.store(out_ptr, acc)


def _probe() -> str | None:
    """Run _runtime_loop_probe in this (interpreting) process: None, or the known interpreter defect."""
    import torch
    import triton

    out = torch.zeros(1, dtype=torch.int32)
    try:
        triton.jit(_runtime_loop_probe)[(1,)](out, 4)
    except Exception as e:
        if "0-dimensional arrays" not in str(e):
            raise
        import numpy

        return (
            f"Triton {triton.__version__}'s interpreter cannot run a loop over a runtime bound under "
            f"numpy {numpy.__version__} ({e}; triton-lang/triton#9171, fixed in later Triton): the "
            "kernels' compiled form is still checked by test_triton_compile.py"
        )
    assert int(out[0]) == 6
    return None


_defect = []


def interpreter_defect() -> str | None:
    """Why Triton's interpreter cannot run our kernels here (a known Triton defect), else None.
    Probed once per process: in-process when this process interprets, else in a child."""
    if not _defect:
        if in_interpreter():
            _defect.append(_probe())
        else:
            code = "import triton_interpreter as t; r = t._probe(); print(r or '')"
            env = {**os.environ, "TRITON_INTERPRET": "1"}
            p = subprocess.run(
                [sys.executable, "-c", code], cwd=HELPERS, env=env, capture_output=True, text=True, timeout=300
            )
            if p.returncode != 0:
                raise RuntimeError(f"interpreter probe failed:\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
            _defect.append(p.stdout.strip() or None)
    return _defect[0]


_outcomes = None


def _run_child() -> dict:
    """{(module, test name): (outcome, message)} from one child pytest under TRITON_INTERPRET=1."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "interpreter.xml"
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        env.pop("PYTEST_ADDOPTS", None)
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *(str(TESTS / m) for m in INTERPRETER_MODULES),
        ]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
        if not xml.exists():
            return {
                "__crash__": (
                    "failed",
                    f"child pytest (exit {proc.returncode}) wrote no report:\n"
                    f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}",
                )
            }
        out = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            module = case.get("classname", "").rsplit(".", 1)[-1]
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                el = case.find(tag)
                if el is not None:
                    outcome = "skipped" if tag == "skipped" else "failed"
                    message = (el.get("message") or "") + ("\n" + el.text if el.text and tag != "skipped" else "")
                    break
            out[(module, case.get("name"))] = (outcome, message)
        return out


def child_outcomes() -> dict:
    global _outcomes
    if _outcomes is None:
        _outcomes = _run_child()
    return _outcomes


def interpreted(fn):
    """Run the test under Triton's interpreter: in-process if this process interprets, else in the
    shared child (see the module docstring)."""
    if importlib.util.find_spec("triton") is None:
        return pytest.mark.skip(reason="Triton is not installed (pip install 'dfmp2[test]')")(fn)
    if in_interpreter():

        @functools.wraps(fn)
        def checked(*args, **kwargs):
            reason = interpreter_defect()
            if reason:
                pytest.skip(reason)
            return fn(*args, **kwargs)

        return checked

    @functools.wraps(fn)
    def from_child(*args, **kwargs):
        nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" (", 1)[0]
        if nodeid.rfind("@") > nodeid.rfind("]"):  # pytest-xdist's --dist loadgroup suffix (conftest.py)
            nodeid = nodeid.rsplit("@", 1)[0]
        path, name = nodeid.split("::", 1)
        outcomes = child_outcomes()
        if "__crash__" in outcomes:
            pytest.fail(outcomes["__crash__"][1], pytrace=False)
        key = (Path(path).stem, name)
        if key not in outcomes:
            pytest.fail(f"{name}: not reported by the TRITON_INTERPRET=1 child run", pytrace=False)
        outcome, message = outcomes[key]
        if outcome == "skipped":
            pytest.skip(message)
        if outcome == "failed":
            pytest.fail(f"under TRITON_INTERPRET=1 (child process):\n{message}", pytrace=False)

    return from_child
