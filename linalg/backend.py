"""Backends: one object per device, built from a device name and passed explicitly.

A backend owns the device placement (``to_device``), synchronisation, and a record of
what actually ran (``kernels_used``), so results and benchmarks can state it. There is
no module-global backend and nothing is read from the environment at import time.

Device names: ``cpu``, ``cuda``, ``cuda:N``, ``trn1``, ``trn2``. What a device can do (fp64, the fit
dtype, the default precision, simulation, pair-step paths) is its ``Capabilities``
(``device_capabilities(name)``, also ``backend.caps``): code outside linalg asks them and never
compares device names. Errors say what is wrong; the CLI adds its options (``alternatives``).
"""

from __future__ import annotations

import torch

from . import cpu_blas as cpu_blas_module
from . import cpu_pair
from .base import CUDA_PAIR_KERNELS, DEVICE_NAMES, DTYPES, OPS, Backend, Capabilities, TorchBackend, device_capabilities
from .errors import DeviceUnavailableError

# base.py's names stay importable from here, where they lived before base.py split them off
__all__ = [
    "DEVICE_NAMES",
    "DTYPES",
    "OPS",
    "Backend",
    "Capabilities",
    "TorchBackend",
    "backend_for",
    "device_capabilities",
    "get_backend",
    "pair_kernel_choices",
    "present_devices",
]


def pair_kernel_choices() -> tuple:
    """Every pair-step path a user may name (--pair-kernel), over all devices; which of them a
    device has: ``device_capabilities(name).pair_kernels``."""
    return tuple(dict.fromkeys(CUDA_PAIR_KERNELS + cpu_pair.PAIR_PATHS))


def _check_cuda(name: str) -> None:
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"device '{name}' requested but no CUDA GPU is usable here "
            f"(torch {torch.__version__}, torch.version.cuda={torch.version.cuda}); "
            "install a CUDA build of PyTorch on a machine with an NVIDIA GPU",
            alternatives=("cpu",),
        )
    idx = torch.device(name).index
    if idx is not None and idx >= torch.cuda.device_count():
        raise DeviceUnavailableError(
            f"device '{name}' requested but only {torch.cuda.device_count()} CUDA device(s) exist"
        )


def get_backend(
    name: str, *, simulate: bool = False, pair_kernel: str = "auto", unrestricted: bool = False, cpu_blas: str = "auto"
) -> Backend:
    """Build the backend for a device name, or raise DeviceUnavailableError before any work.

    ``simulate`` (trn1/trn2 only) runs the NKI kernels on this CPU through ``nki.simulate``
    or the project's NumPy execution of NKI; the backend's ``engine`` says which.
    ``pair_kernel``: the MP2 pair-step path, one of ``pair_kernel_choices()``: on cuda 'auto',
    'gemm+epilogue' or 'fused' (linalg.cuda); on cpu 'auto', 'gemm+epilogue' or 'gemm+torch'
    (linalg.cpu_pair: its C epilogue is built here, KernelError when it cannot be); trn has one
    path, so a choice other than 'auto' is an error there (ValueError), as is a path of another device.
    ``unrestricted``: the run has opposite-spin pair blocks (UMP2, ``eps_vir_j``); on cuda 'auto'
    then resolves to gemm+epilogue and 'fused' (which has no opposite-spin form) is refused.
    ``cpu_blas`` (cpu only): the BLAS of the GEMMs, SYRKs and pair-step GEMMs, 'auto' (measured),
    'torch' or 'openblas' (linalg.cpu_blas); another device refuses anything but 'auto'
    (cpu_blas.CpuBlasChoiceError, a ValueError), before any work.
    """
    caps = device_capabilities(name)
    cpu_blas_module.check_choice(cpu_blas, name, caps.is_host)
    if pair_kernel not in pair_kernel_choices():
        raise ValueError(f"unknown pair kernel '{pair_kernel}'; use one of {', '.join(pair_kernel_choices())}")
    if pair_kernel not in caps.pair_kernels:
        raise ValueError(
            f"pair kernel '{pair_kernel}' is not a pair-step path of device '{name}' (its paths: "
            f"{', '.join(caps.pair_kernels)})"
        )
    if simulate and not caps.simulable:
        raise ValueError(f"simulation applies only to trn1/trn2, not to device '{name}'")
    if name == "cpu":
        return TorchBackend("cpu", cpu_blas=cpu_blas, pair_kernel=pair_kernel)
    if name.split(":", 1)[0] == "cuda":
        _check_cuda(name)
        from .cuda import make_cuda_backend  # torch dense ops + the Triton pair kernel

        return make_cuda_backend(name, pair_kernel=pair_kernel, **({"unrestricted": True} if unrestricted else {}))
    from .neuron import make_neuron_backend

    return make_neuron_backend(name, simulate=simulate)


def present_devices(precision: str) -> tuple[list[str], dict]:
    """The devices present here that can run ``precision``, and {device: why not} for the others.
    Decided as ``get_backend`` decides (torch sees a CUDA GPU; AWS's nki package imports and a
    /dev/neuron* device exists). Trainium hardware is listed only when the instance type (DMI
    product name) says which generation it is; it is never simulated."""
    from dfmp2.kernels.nki import engines

    present, absent = ["cpu"], {}
    if torch.cuda.is_available():
        present.append("cuda")
    else:
        absent["cuda"] = "no CUDA GPU visible to torch"
    nki, _why = engines.real_nki()
    trn_problem = device_capabilities(engines.TARGETS[0]).precision_problem(precision)
    if nki is None:
        trn_why = "no AWS Neuron SDK"
    elif not engines.neuron_devices():
        trn_why = "no /dev/neuron* device"
    elif trn_problem:
        trn_why = f"Trainium: {trn_problem}"
    else:
        try:
            with open("/sys/devices/virtual/dmi/id/product_name") as f:
                product = f.read().strip().lower()
        except OSError:
            product = ""
        gen = next((t for t in engines.TARGETS if product.startswith(t)), None)
        if gen:
            present.append(gen)
        trn_why = (
            f"this is a {gen} instance"
            if gen
            else "a Neuron device of unknown generation (name trn1 or trn2 explicitly)"
        )
    for t in engines.TARGETS:
        if t not in present:
            absent[t] = trn_why
    return present, absent


def backend_for(t: torch.Tensor) -> Backend:
    """A torch backend for a tensor's own device (used when no backend is passed)."""
    return TorchBackend(str(t.device))
