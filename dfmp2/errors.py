"""User-facing errors: each carries one line saying what is wrong, where, and what to do.

The CLI prints ``error: <message>`` for these and exits non-zero, without a traceback.
"""


class InputError(Exception):
    """Bad user input (file, molecule, options). Raised before heavy work where possible."""


class SCFNotConvergedError(InputError):
    """The RHF reference did not converge; MP2 on top of it would be meaningless."""


class MemoryLimitError(InputError):
    """The run's memory estimate exceeds the limit; raised before the heavy work."""


def shown(text: str, limit: int = 60) -> str:
    """User text as quoted in an error line: stripped, control characters (newlines included)
    escaped so the message stays one line, and shortened to ``limit`` characters."""
    t = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text).strip())
    return t if len(t) <= limit else t[:limit] + "..."
