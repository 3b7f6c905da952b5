"""Errors raised by the linear-algebra layer."""


class DeviceUnavailableError(RuntimeError):
    """The requested device cannot run here. Raised before any work; the message names what is missing."""


class ConvergenceError(RuntimeError):
    """An iterative method (Newton–Schulz) did not converge."""
