"""The Trainium (trn1/trn2) backend: dispatches linalg ops to the NKI kernels in kernels/nki.

Placeholder until the NKI kernels land: any trn device raises DeviceUnavailableError.
"""
from __future__ import annotations

from .errors import DeviceUnavailableError


def make_neuron_backend(name: str, *, simulate: bool = False):
    """Build the trn1/trn2 backend, or raise DeviceUnavailableError naming what to install."""
    raise DeviceUnavailableError(
        f"device '{name}' needs the AWS Neuron SDK (neuronx-cc, nki) and a Trainium instance, "
        "and they are not available here; install them from AWS's index "
        "(pip install --extra-index-url https://pip.repos.neuron.amazonaws.com neuronx-cc nki) "
        "on a trn1/trn2 instance, or use --device cpu")
