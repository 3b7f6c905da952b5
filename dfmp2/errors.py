"""User-facing errors: each carries one line saying what is wrong, where, and what to do.

The CLI prints ``error: <message>`` for these and exits non-zero, without a traceback.
"""


class InputError(Exception):
    """Bad user input (file, molecule, options). Raised before heavy work where possible."""


class SCFNotConvergedError(InputError):
    """The RHF reference did not converge; MP2 on top of it would be meaningless."""


class MemoryLimitError(InputError):
    """The run's memory estimate exceeds the limit; raised before the heavy work."""
