"""dfmp2's linear-algebra layer: device-neutral ops over torch tensors, one backend per device."""

if __name__ != "dfmp2.linalg":  # one module, one name: never loaded twice as two classes
    raise ImportError(f"the linear-algebra layer is dfmp2.linalg; import it by that name, not as {__name__!r}")
from . import cpu_blas, philox
from .backend import (
    DEVICE_NAMES,
    DTYPES,
    Backend,
    Capabilities,
    TorchBackend,
    backend_for,
    device_capabilities,
    get_backend,
    present_devices,
)
from .errors import ConvergenceError, DeviceUnavailableError, KernelError, NotPositiveDefiniteError
from .ops import cholesky, eigh, gemm, inv_sqrt_spd, mp2_pair_energy, syrk, trsm
from .synthetic import SyntheticProblem, random_matrix, random_spd, synthetic_problem

__all__ = [
    "DEVICE_NAMES",
    "DTYPES",
    "Backend",
    "Capabilities",
    "ConvergenceError",
    "DeviceUnavailableError",
    "KernelError",
    "NotPositiveDefiniteError",
    "SyntheticProblem",
    "TorchBackend",
    "backend_for",
    "cholesky",
    "cpu_blas",
    "device_capabilities",
    "eigh",
    "gemm",
    "get_backend",
    "inv_sqrt_spd",
    "mp2_pair_energy",
    "philox",
    "present_devices",
    "random_matrix",
    "random_spd",
    "synthetic_problem",
    "syrk",
    "trsm",
]
