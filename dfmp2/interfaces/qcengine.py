"""The QCEngine harness of dfmp2, shipped with the package: importing this module registers
program ``dfmp2`` with QCEngine (QCEngine finds no harness by itself)::

    import qcengine
    import dfmp2.qcengine            # registers "dfmp2" (this module, by its public name)
    result = qcengine.compute(atomic_input, "dfmp2")      # AtomicResult or FailedOperation

The calculation runs in this process (``dfmp2.interfaces.qcschema.run_qcschema``: no subprocess, no
files). QCEngine hands a harness a QCSchema v2 AtomicInput whatever it was given and converts the
result back to the input's version (``qcengine.compute(..., return_version=)``), so v1 and v2
inputs both work. What QCEngine's task config sets: ``memory`` (GiB) becomes the run's memory
limit on a host device (cpu, trn*) unless ``keywords.memory_mb`` gives one (on a GPU the limit
is the GPU's: keywords.memory_mb or 80 % of its free memory); ``ncores``, torch's thread count
for the call; ``scratch_directory``, where out-of-core files go. ``driver`` ``energy``,
``gradient`` (RHF or UHF: dfmp2.interfaces.qcschema), ``hessian`` (``dfmp2 frequencies``' Hessian)
or ``properties`` (the energy and the relaxed dipole; both dfmp2.interfaces.qcschema_drivers); the
result keeps the input's ``id``. Psi4's keyword names where they map one to one
(dfmp2.interfaces.qcschema_keywords).

An expected error becomes a FailedOperation whose ``error_message`` is QCEngine's header and
dfmp2's one line (``dfmp2.interfaces.qcschema.error_line``: the AtomicInput field it is about, never a
CLI flag); ``error_type``: input_error, convergence_error (an SCF that did not converge),
resource_error (the memory limit, the disk, a device that is not here) or unknown_error (a
device kernel that failed); ``error.extras["dfmp2_error"]`` names dfmp2's exception class.
"""

from __future__ import annotations

from typing import Any, ClassVar

try:
    import qcengine
    from qcengine import exceptions as qcex
    from qcengine.programs.model import ProgramHarness
except ImportError as e:  # say what to install, not only which module is missing
    raise ImportError(
        f"dfmp2.qcengine is a QCEngine harness and needs the qcengine package ({e}); "
        'install it with: pip install -e ".[qcschema]"'
    ) from e

PROGRAM = "dfmp2"
GIB = 2**30  # QCEngine's memory unit (bytes)


class DFMP2Harness(ProgramHarness):
    """QCEngine's ProgramHarness for dfmp2: ``compute(v2 AtomicInput, TaskConfig)`` -> v2
    AtomicResult, in process."""

    _defaults: ClassVar[dict[str, Any]] = {
        "name": PROGRAM,
        "scratch": True,
        "thread_safe": False,
        "thread_parallel": True,
        "node_parallel": False,
        "managed_memory": True,
    }

    @staticmethod
    def found(raise_error: bool = False) -> bool:
        """Always True: this module is part of dfmp2, so importing it found the program."""
        return True

    def get_version(self) -> str:
        import dfmp2

        return dfmp2.__version__

    def compute(self, input_model, config):
        """Run ``input_model`` (a v2 AtomicInput) with QCEngine's ``config``: the v2
        AtomicResult, or a qcengine exception (InputError, ConvergenceError, ResourceError,
        UnknownError) carrying dfmp2's one-line message."""
        from dfmp2.interfaces.api import torch_threads
        from dfmp2.interfaces.qcschema import run_qcschema

        try:
            options = run_options(input_model, config)
            with torch_threads(config.ncores):
                return run_qcschema(input_model, options)
        except Exception as e:
            mapped = qcengine_error(e)
            if mapped is None:
                raise
            raise mapped from e


def run_options(input_model, config):
    """The RunOptions QCEngine's task config sets (the input's model, molecule and keywords set
    the rest): the scratch directory, and the memory limit (MB) on a host device unless
    ``keywords.memory_mb`` gives one."""
    from dfmp2 import linalg
    from dfmp2.memory import MB
    from dfmp2.options import RunOptions

    keywords = input_model.specification.keywords
    kw = {}
    if config.scratch_directory:
        kw["scratch_dir"] = str(config.scratch_directory)
    device = keywords.get("device", RunOptions.device)
    try:
        host = isinstance(device, str) and linalg.device_capabilities(device.strip()).host_memory
    except ValueError:  # an unknown device: the run refuses it with its own message
        host = False
    if config.memory and "memory_mb" not in keywords and host:
        kw["memory_mb"] = float(config.memory) * GIB / MB
    return RunOptions(**kw)


def qcengine_error(e: Exception):
    """The qcengine exception for one of dfmp2's expected errors (None for anything else: a bug,
    which QCEngine reports with its traceback)."""
    from dfmp2.errors import DiskWriteError, InputError, MemoryLimitError, SCFNotConvergedError
    from dfmp2.interfaces.qcschema import error_line
    from dfmp2.linalg import DeviceUnavailableError, KernelError

    kinds = (
        (SCFNotConvergedError, qcex.ConvergenceError),
        (MemoryLimitError, qcex.ResourceError),
        (DiskWriteError, qcex.ResourceError),
        (InputError, qcex.InputError),
        (DeviceUnavailableError, qcex.ResourceError),
        (KernelError, qcex.UnknownError),
    )
    for ours, theirs in kinds:
        if isinstance(e, ours):
            return theirs(error_line(e), extras={"dfmp2_error": type(e).__name__})
    return None


def register() -> None:
    """Register the harness with QCEngine once (importing this module does it)."""
    if PROGRAM not in qcengine.list_all_programs():
        qcengine.register_program(DFMP2Harness())


register()
