"""Triton's interpreter setting (the helper that runs the @interpreted tests of other modules in
one TRITON_INTERPRET=1 child is tests/helpers/triton_interpreter.py)."""

import importlib.util

import pytest
from triton_interpreter import in_interpreter

NO_TRITON = importlib.util.find_spec("triton") is None


@pytest.mark.skipif(NO_TRITON, reason="Triton is not installed (pip install 'dfmp2[test]')")
@pytest.mark.skipif(in_interpreter(), reason="checks a process that compiles (TRITON_INTERPRET unset)")
def test_interpreter_setting_after_import_is_a_clear_error(monkeypatch):
    """TRITON_INTERPRET=1 set after triton was imported to compile: a clear error, not a crash
    deep in the kernel."""
    import triton.language  # noqa: F401  (this process now compiles)

    from dfmp2.kernels.triton.launch import interpreting

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="before the process imports triton"):
        interpreting()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert interpreting() is False


@pytest.mark.skipif(NO_TRITON, reason="Triton is not installed (pip install 'dfmp2[test]')")
@pytest.mark.skipif(in_interpreter(), reason="checks a process that compiles (TRITON_INTERPRET unset)")
def test_cpu_tensors_need_the_interpreter(monkeypatch):
    """Without the interpreter a CPU tensor is an error naming TRITON_INTERPRET (no torch fallback)."""
    import torch

    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    B = torch.ones(2, 5, 6, dtype=torch.float64)
    e = -torch.ones(2, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        fused_pair_energy(B, B, e, e, torch.ones(5, dtype=torch.float64))
