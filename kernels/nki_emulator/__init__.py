"""A small NumPy execution of the NKI subset that dfmp2's kernels use.

Used for ``--device trn1|trn2 --simulate`` when AWS's ``nki`` package (with
``nki.simulate``) is not installed. It runs the same kernel source as the hardware and
as nki.simulate, enforces the documented NeuronCore limits (see ``limits``) and raises
on any violation. It does not model timing, engine parallelism or bit-exact hardware
arithmetic; results are fp32 NumPy arithmetic.

    from dfmp2.kernels.nki_emulator import simulate
    out = simulate(my_kernel, target="trn1")(a, b)
"""

from .errors import HardwareLimitError, NkiEmulatorError, UnsupportedError
from .launch import ENGINE, bind, run, simulate
from .limits import TARGETS, CoreLimits, limits_for

__all__ = [
    "ENGINE",
    "TARGETS",
    "CoreLimits",
    "HardwareLimitError",
    "NkiEmulatorError",
    "UnsupportedError",
    "bind",
    "limits_for",
    "run",
    "simulate",
]
