"""User-facing errors: each carries one line saying what is wrong, where, and what to do.

The CLI prints ``error: <message>`` for these and exits non-zero, without a traceback.
"""


class InputError(Exception):
    """Bad user input (file, molecule, options). Raised before heavy work where possible.

    ``option``: the ``dfmp2.options.RunOptions`` field the error is about (None: not one option).
    The message says what is wrong in the library's words; the CLI adds its flag for ``option``."""

    def __init__(self, *args, option: str | None = None):
        super().__init__(*args)
        self.option = option


class SCFNotConvergedError(InputError):
    """The RHF reference did not converge; MP2 on top of it would be meaningless."""


class MemoryLimitError(InputError):
    """The run's memory estimate exceeds the limit; raised before the heavy work."""


# What the library's errors propose (linalg's ``alternatives``), as the CLI's options.
OPTION_HINTS = {"cpu": "--device cpu", "simulate": "--simulate (the kernels on this CPU)",
                "integrals-host": "--integrals host"}


# The CLI flag of a RunOptions field where it is not '--' + the field with '-' for '_'.
FLAGS = {"memory_mb": "--memory", "scratch_dir": "--scratch", "scf_mode": "--scf",
         "frozen_core": "--frozen-core/--all-electron"}


def flag(option: str) -> str:
    """The CLI flag of RunOptions field ``option``."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def error_line(e: Exception) -> str:
    """The one line the CLI prints for an expected error: the library's message (what is wrong)
    followed by the flag of the option it is about (``InputError.option``) and the options that
    would help."""
    if isinstance(e, MemoryLimitError):
        return f"{e} (the limit is set with --memory)"
    text = f"{e} ({flag(e.option)})" if getattr(e, "option", None) else str(e)
    hints = [OPTION_HINTS[a] for a in getattr(e, "alternatives", ()) if a in OPTION_HINTS]
    return f"{text}; or use {' or '.join(hints)}" if hints else text


def shown(text: str, limit: int = 60) -> str:
    """User text as quoted in an error line: stripped, control characters (newlines included)
    escaped so the message stays one line, and shortened to ``limit`` characters."""
    t = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text).strip())
    return t if len(t) <= limit else t[:limit] + "..."
