"""The ``nl`` and ``nisa`` names that the kernels in this package are written against.

When AWS's NKI package is importable (``import nki.language``, ``import nki.isa``; the
Neuron SDK from AWS's package index, not PyPI's empty placeholder), these ARE
``nki.language`` and ``nki.isa``, so ``nki.jit`` and ``nki.simulate`` see ordinary NKI
kernels. Otherwise they are the NumPy emulator's modules, so the kernel modules still
import. Which engine runs a kernel is never decided here: kernels/nki/engines.py picks
it explicitly (the emulator re-binds these names to itself at launch, and the hardware
and nki.simulate engines refuse to run unless ``REAL_NKI`` is true).
"""

from __future__ import annotations

try:
    import nki.isa as nisa
    import nki.language as nl

    REAL_NKI = True
    REAL_NKI_ERROR = None
except ImportError as exc:  # not installed, or PyPI's empty placeholder
    from ..nki_emulator import isa as nisa
    from ..nki_emulator import language as nl

    REAL_NKI = False
    REAL_NKI_ERROR = f"{type(exc).__name__}: {exc}"

__all__ = ["REAL_NKI", "REAL_NKI_ERROR", "nisa", "nl"]
