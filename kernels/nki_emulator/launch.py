"""Running a kernel function under the emulator.

The kernel's own source is executed unchanged: its code object is re-bound to a global
namespace in which ``nl`` and ``nisa`` are this package's ``language`` and ``isa``
modules, whatever the kernel's module imported. That lets one process run the same
kernel on the emulator and on AWS's nki.simulate side by side. Kernels must therefore
reach NKI only through the global names ``nl`` and ``nisa``. Helper functions defined in
the kernel's own module (plain functions sharing its globals) are re-bound to the same
namespace, so a kernel may call them; helpers from other modules are not.

Arguments that are NumPy arrays become read-only HBM tensors; everything else (Python
numbers and booleans) passes through as a compile-time constant, as with nki.simulate.
Returned HBM tensors come back as NumPy arrays.
"""

from __future__ import annotations

import types

import numpy as np

from . import isa as _isa
from . import language as _language
from .core import Core, activate, deactivate
from .errors import NkiEmulatorError
from .limits import limits_for
from .tensor import Tensor, wrap_hbm

ENGINE = "nki-numpy-emulator"


def bind(kernel):
    """The kernel function with ``nl``/``nisa`` resolved to the emulator."""
    fn = getattr(kernel, "__wrapped__", kernel)
    if not isinstance(fn, types.FunctionType):
        raise NkiEmulatorError(f"{kernel!r} is not a plain Python kernel function")
    if "nki" in fn.__code__.co_names:
        raise NkiEmulatorError(
            f"kernel {fn.__name__} reaches NKI through the name 'nki'; kernels use only the globals nl and nisa"
        )
    g = dict(fn.__globals__)
    g["nl"], g["nisa"] = _language, _isa
    for name, helper in fn.__globals__.items():  # the module's own functions see the same nl/nisa
        if isinstance(helper, types.FunctionType) and helper.__globals__ is fn.__globals__:
            g[name] = _rebind(helper, g)
    return _rebind(fn, g)


def _rebind(fn, g):
    """``fn`` with ``g`` as its global namespace."""
    bound = types.FunctionType(fn.__code__, g, fn.__name__, fn.__defaults__, fn.__closure__)
    bound.__kwdefaults__ = fn.__kwdefaults__
    return bound


def _to_numpy(out, what):
    if isinstance(out, Tensor):
        if out.on_chip:
            raise NkiEmulatorError(f"{what}: kernels return HBM tensors, not {out!r}")
        return np.array(out._data)
    if isinstance(out, tuple):
        return tuple(_to_numpy(o, what) for o in out)
    if out is None:
        return None
    raise NkiEmulatorError(f"{what}: unexpected kernel return value {type(out).__name__}")


def run(kernel, args, kwargs=None, *, target: str = "trn1"):
    """Execute ``kernel(*args, **kwargs)`` on a fresh emulated core.
    Returns (outputs as NumPy, launch statistics)."""
    fn = bind(kernel)
    core = Core(limits_for(target))
    token = activate(core)
    try:
        hbm_args = [wrap_hbm(a, f"arg{i}") if isinstance(a, np.ndarray) else a for i, a in enumerate(args)]
        hbm_kwargs = {k: (wrap_hbm(v, k) if isinstance(v, np.ndarray) else v) for k, v in (kwargs or {}).items()}
        out = fn(*hbm_args, **hbm_kwargs)
        return _to_numpy(out, fn.__name__), core.stats()
    finally:
        deactivate(token)


def simulate(kernel, *, target: str = "trn1"):
    """Like ``nki.simulate(kernel)``: a callable that runs the kernel on NumPy arrays.
    The statistics of the latest call are kept in its ``last_stats`` attribute."""

    def call(*args, **kwargs):
        out, call.last_stats = run(kernel, args, kwargs, target=target)
        return out

    call.last_stats = None
    call.__name__ = getattr(kernel, "__name__", "kernel")
    return call
