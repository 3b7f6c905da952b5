"""User-facing errors: each carries one line saying what is wrong, where, and what to do.

The CLI prints ``error: <message>`` for these and exits ``EXIT_USER_ERROR``, without a traceback
(dfmp2.cli.options.user_errors).
"""

import stat

EXIT_USER_ERROR = 2  # every command: bad input, a device that cannot run, a kernel that failed
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT); SIGTERM and SIGHUP exit 128 + their number (143, 129)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP while a run goes on (raised in the main thread, as Ctrl-C raises
    KeyboardInterrupt, so every ``finally`` runs); the CLI exits ``exit_code`` = 128 + signum."""

    def __init__(self, signum: int, name: str):
        super().__init__(name)
        self.signum, self.name = int(signum), name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class InputError(Exception):
    """Bad user input (file, molecule, options). Raised before heavy work where possible.

    ``option``: the ``dfmp2.options.RunOptions`` field the error is about, or a tuple of them
    (None: no option), or a parameter of the function that raised (e.g. ``fragments``). The message
    says what is wrong in the library's words; the CLI adds the flag (``flag``)."""

    def __init__(self, *args, option: str | tuple[str, ...] | None = None):
        # one line whatever user text the message quotes (a newline in a basis or device name)
        super().__init__(*(one_line(a) if isinstance(a, str) else a for a in args))
        self.option = option


class DiskWriteError(InputError):
    """A write to disk failed while the run went on (the disk filled up, a quota, a file-size limit,
    an I/O error): what was being written, where and why; what the run created is removed."""


class SCFNotConvergedError(InputError):
    """The RHF reference did not converge; MP2 on top of it would be meaningless."""


class MemoryLimitError(InputError):
    """The run's memory estimate exceeds the limit; raised before the heavy work. ``need_mb``:
    the least memory (MB) the refusing stage could run in; ``limit_mb``: the limit it met."""

    def __init__(
        self, *args, option: str | None = "memory_mb", need_mb: float | None = None, limit_mb: float | None = None
    ):
        super().__init__(*args, option=option)
        self.need_mb, self.limit_mb = need_mb, limit_mb


# The CLI flag of an option (a RunOptions field or a command's parameter): '--' + the name with
# '-' for '_', but for these. dfmp2.cli.options declares every shared option with this flag.
FLAGS = {
    "memory_mb": "--memory",
    "scratch_dir": "--scratch",
    "scf_mode": "--scf",
    "frozen_core": "--frozen-core/--all-electron",
    "scf_stability": "--scf-stability/--no-scf-stability",
    "input": "INPUT",  # the commands' argument (the molecule's file), not a flag
}
# What the library's errors propose (linalg's ``alternatives``), as the CLI's options.
OPTION_HINTS = {
    "cpu": "--device cpu",
    "simulate": "--simulate (the kernels on this CPU)",
    "integrals-host": "--integrals host",
}


def flag(option: str) -> str:
    """The CLI flag of an option: 'scf_max_cycle' -> '--scf-max-cycle', 'memory_mb' -> '--memory'."""
    return FLAGS.get(option, "--" + option.replace("_", "-"))


def error_line(e: Exception) -> str:
    """The one line the CLI prints for an expected error: the library's message (what is wrong),
    the flag of the option it is about (``InputError.option``) and the options that would help."""
    option = getattr(e, "option", None)
    options = (option,) if isinstance(option, str) else tuple(option or ())
    line = str(e) + (f" ({', '.join(flag(o) for o in options)})" if options else "")
    hints = [OPTION_HINTS[a] for a in getattr(e, "alternatives", ()) if a in OPTION_HINTS]
    return f"{line}; or use {' or '.join(hints)}" if hints else line


def one_line(text: str) -> str:
    """``text`` with its control characters (newlines included) escaped as Python writes them."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


def shown(text: str, limit: int = 60) -> str:
    """User text as quoted in an error line: stripped, control characters (newlines included)
    escaped so the message stays one line, and shortened to ``limit`` characters."""
    t = one_line(str(text).strip())
    return t if len(t) <= limit else t[:limit] + "..."


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for an error line ('a character device')."""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISREG, "a regular file"),
    ):
        if test(mode):
            return what
    return "not a regular file"
