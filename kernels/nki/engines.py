"""The three engines that run the same NKI kernel source, chosen explicitly, never by fallback.

- ``neuron-hardware``: ``nki.jit(kernel)(*numpy_arrays)`` compiles and runs on a NeuronCore
  (nki.jit reference: NumPy arguments "compile and execute standalone kernel, without a
  framework"). Needs AWS's nki package and a Neuron device (/dev/neuron*).
- ``nki.simulate``: ``nki.simulate(kernel)(*numpy_arrays)``, AWS's CPU simulator
  (nki/guides/nki_simulator). Needs AWS's nki package.
- ``nki-numpy-emulator``: kernels.nki_emulator, this project's NumPy execution of the NKI
  subset our kernels use, for when the nki package is not installed.

The NeuronCore generation is passed to the two AWS engines through the documented
``NEURON_PLATFORM_TARGET_OVERRIDE`` variable (trn1 or trn2), set only for the duration of
each call and restored afterwards; it is never read at import time.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
from collections import Counter

HARDWARE = "neuron-hardware"
NKI_SIMULATE = "nki.simulate"
EMULATOR = "nki-numpy-emulator"
ENGINES = (HARDWARE, NKI_SIMULATE, EMULATOR)
TARGETS = ("trn1", "trn2")

INSTALL_HINT = (
    "pip install --extra-index-url https://pip.repos.neuron.amazonaws.com neuronx-cc nki "
    "(AWS's index; the PyPI packages of those names are empty placeholders)"
)


def real_nki():
    """(nki module, None) when AWS's NKI package with nki.jit and nki.simulate imports,
    else (None, reason)."""
    try:
        nki = importlib.import_module("nki")
        importlib.import_module("nki.language")
        importlib.import_module("nki.isa")
    except ImportError as exc:
        return None, f"the 'nki' package is not importable ({exc})"
    missing = [n for n in ("jit", "simulate") if not hasattr(nki, n)]
    if missing:
        return None, f"the installed 'nki' package lacks nki.{', nki.'.join(missing)} (PyPI placeholder?)"
    return nki, None


def neuron_devices() -> list[str]:
    return sorted(glob.glob("/dev/neuron*"))


@contextlib.contextmanager
def _platform_target(target: str):
    key = "NEURON_PLATFORM_TARGET_OVERRIDE"
    old = os.environ.get(key)
    os.environ[key] = target
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


class KernelRunner:
    """Runs kernel functions on one engine for one target and counts what ran.

    ``runner(kernel, *arrays, **constants)`` returns the kernel's outputs as NumPy arrays.
    ``shapes`` records every distinct (kernel, argument shapes, constants) signature, i.e.
    what the hardware engine compiles once each (nki.jit caches compiled kernels by argument
    shapes, dtypes and compile-time values: NKI Language Guide, "Kernel Caching").
    """

    def __init__(self, engine: str, target: str):
        if engine not in ENGINES:
            raise ValueError(f"unknown NKI engine '{engine}'; use one of {', '.join(ENGINES)}")
        if target not in TARGETS:
            raise ValueError(f"unknown Trainium target '{target}'; use trn1 or trn2")
        self.engine, self.target = engine, target
        self.launches: Counter = Counter()
        self.shapes: set = set()
        self.emulator_totals: Counter = Counter()
        self._nki = None
        self._jitted = {}
        if engine in (HARDWARE, NKI_SIMULATE):
            self._nki, why = real_nki()
            if self._nki is None:
                raise RuntimeError(f"engine {engine} needs AWS's nki package: {why}")
            from . import lang

            if not lang.REAL_NKI:  # the kernels would be bound to the emulator's nl/nisa
                raise RuntimeError(
                    f"engine {engine}: kernels/nki/lang.py bound the emulator "
                    f"({lang.REAL_NKI_ERROR}); refusing to run emulator code as {engine}"
                )

    def signature(self, kernel, arrays, constants) -> tuple:
        return (kernel.__name__, tuple(tuple(a.shape) for a in arrays), tuple(sorted(constants.items())))

    def __call__(self, kernel, *arrays, **constants):
        self.launches[kernel.__name__] += 1
        self.shapes.add(self.signature(kernel, arrays, constants))
        if self.engine == EMULATOR:
            from ..nki_emulator import run

            out, stats = run(kernel, arrays, constants, target=self.target)
            self.emulator_totals["matmul_flops"] += stats["matmul_flops"]
            self.emulator_totals["dma_bytes"] += stats["dma_bytes"]
            self.emulator_totals["instructions"] += sum(stats["instructions"].values())
            return out
        with _platform_target(self.target):
            if self.engine == NKI_SIMULATE:
                return self._nki.simulate(kernel)(*arrays, **constants)
            jitted = self._jitted.get(kernel)
            if jitted is None:
                jitted = self._jitted[kernel] = self._nki.jit(kernel)
            return jitted(*arrays, **constants)

    def describe(self) -> dict:
        d = {
            "engine": self.engine,
            "target": self.target,
            "launches": dict(sorted(self.launches.items())),
            "compiled_shapes": len(self.shapes),
            "shapes": sorted(f"{name}{list(shapes)}{dict(c) if c else ''}" for name, shapes, c in self.shapes),
        }
        if self.engine == EMULATOR:
            d["emulated"] = dict(self.emulator_totals)
        elif self._nki is not None:
            d["nki_version"] = getattr(self._nki, "__version__", "unknown")
        return d
