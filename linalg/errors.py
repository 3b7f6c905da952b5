"""Errors raised by the linear-algebra layer."""

import torch


class DeviceUnavailableError(RuntimeError):
    """The requested device cannot run here. Raised before any work; the message names what is
    missing. ``alternatives`` says what else would run: 'cpu' (another device), 'simulate' (its
    kernels on this CPU); the CLI turns them into its options."""

    def __init__(self, message: str, alternatives: tuple = ()):
        super().__init__(message)
        self.alternatives = tuple(alternatives)


class ConvergenceError(RuntimeError):
    """An iterative method (Newton–Schulz) did not converge."""


class NotPositiveDefiniteError(torch.linalg.LinAlgError):
    """Cholesky met a non-positive leading minor. A torch.linalg.LinAlgError, so callers that
    catch torch's error (e.g. to fall back to an eigendecomposition) keep working."""


class KernelError(RuntimeError):
    """A device kernel failed to compile or launch. One line naming the kernel, the device (GPU or
    Triton interpreter) and the compiler version; nothing else was run in its place."""
