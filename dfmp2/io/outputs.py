"""Output files: checked before the heavy work, written without clobbering anything else.

Every command that writes a file (``run --json``, ``regress --json``, ``compare --json``,
``bench --out``, the scratch and checkpoint directories) checks its paths with
``check_output_file`` / ``check_output_dir`` first, so a path that cannot be written is one
``error:`` line and exit 2 before the SCF, not a traceback after it; ``check_disk`` checks that
the scratch files and the checkpoint fit on their disks.

Writing rules (``write_text``, ``write_bytes``):

* a regular file, or nothing, at the path: written to a temporary file in the same directory,
  then renamed over the path, so a half-written file never appears under the name. The new file
  gets the mode the user's umask gives (0644 with umask 022), as a plain ``open`` would. A
  symbolic link is followed: the file it points at is replaced, the link stays;
* anything else that exists (a character device such as /dev/null or /dev/stdout, a FIFO):
  written into directly, never replaced: renaming over /dev/null would make it a regular file;
* a directory, a path whose parent is missing or not a directory, or a directory where no file
  can be created (read-only file system, permissions): refused;
* the run's own input or checkpoint: refused, so ``--json mol.xyz`` cannot overwrite the input;
* ``-`` (``STDOUT``) is standard output: the text is written to ``sys.stdout``; a path that is
  the same file as standard output (``/dev/stdout``, ``/proc/self/fd/1``) counts as ``-`` too
  (``is_stdout``), so a command prints its tables elsewhere (stderr) and its stdout holds the
  document alone. At most one output of a run can be standard output.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import io
import os
import re
import shutil
import stat
import sys
import uuid
from pathlib import Path

from dfmp2.errors import DiskWriteError, InputError
from dfmp2.memory import human


def _naming_option(fn):
    """``fn(..., option=None)``: the InputError it raises names ``option`` (the RunOptions field
    the path came from, e.g. 'scratch_dir'), so the CLI can add its flag."""

    @functools.wraps(fn)
    def wrapper(*args, option: str | None = None, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as e:
            e.option = e.option or option
            raise

    return wrapper


def _probe_writable(directory: Path, what: str) -> None:
    """InputError unless a file can be created in ``directory``. Tried for real (a probe file,
    removed at once) since permission bits say nothing for root, and a read-only mount, /proc or
    a full inode table refuse even root."""
    probe = directory / f".dfmp2-probe-{uuid.uuid4().hex}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise InputError(f"{what}: cannot create files in {directory} ({e.strerror})") from None
    os.close(fd)
    os.unlink(probe)


def _same(a, b) -> bool:
    """Do paths ``a`` and ``b`` name the same file (the same inode, or the same path once
    resolved when either does not exist yet)?"""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


STDOUT = "-"  # an output path that means standard output


def is_stdout(path) -> bool:
    """Whether output ``path`` is standard output: ``-``, or the same file as this process's
    stdout (``/dev/stdout``, a file stdout is redirected to; not /dev/null, which takes anything
    from anyone); None is no output."""
    if path is None or str(path) == "":
        return False
    if str(path) == STDOUT:
        return True
    try:
        fd = sys.stdout.fileno()
        a, b = os.fstat(fd), os.stat(path)
        if os.path.samefile(path, os.devnull):
            return False
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _check_stdout(path: Path, what: str, not_same_as) -> Path:
    """``check_output_file`` for standard output: no other output of the run may go there too."""
    for label, other in not_same_as:
        if label != "input" and is_stdout(other):
            raise InputError(f"{what} {path} and the {label} {other} both go to standard output; give one a file")
    return path


def _rank_file_of(p: Path, checkpoint) -> int | None:
    """The rank r when ``p`` is the checkpoint's rank file ``<checkpoint>.rank<r>``
    (dfmp2.io.rank_checkpoint.rank_path) in its directory; None otherwise."""
    ck = Path(checkpoint)
    m = re.fullmatch(re.escape(ck.name) + r"\.rank([0-9]+)", p.name)
    if m is None or not _same(p.parent if str(p.parent) else ".", ck.parent if str(ck.parent) else "."):
        return None
    return int(m.group(1))


def _check_not_same(p: Path, what: str, not_same_as) -> None:
    """InputError when ``p`` is one of ``not_same_as``'s files (standard output aside: ``-`` is no
    file), or a checkpoint's rank file."""
    for label, other in not_same_as:
        if other is None or str(other) == STDOUT:
            continue
        if _same(p, other):
            raise InputError(f"{what} {p} is the {label}; it would be overwritten: give another path")
        rank = _rank_file_of(p, other) if "checkpoint" in label else None
        if rank is not None:
            raise InputError(
                f"{what} {p} is rank {rank}'s file of the {label} {other} (a run over ranks keeps one "
                "file per rank beside it); it would be overwritten: give another path"
            )


@_naming_option
def check_output_file(path, what: str, *, not_same_as=()) -> Path:
    """Check, before any heavy work, that ``write_text(path, ...)`` can succeed; return the path.

    what: the file, for the message (e.g. 'checkpoint', or a CLI's '--json'). not_same_as:
    (label, path) pairs of files this run reads or writes otherwise (the input, the checkpoint),
    which must not be overwritten; None paths are skipped. Raises InputError (one line;
    ``option=``: the field it is about, ``_naming_option``).
    """
    p = Path(path)
    if str(path) == "":
        raise InputError(f"{what}: the path is empty; give a file name")
    if is_stdout(path):  # '-' or stdout itself
        return _check_stdout(p, what, not_same_as)
    if p.name in ("", ".", ".."):
        raise InputError(f"{what}: '{path}' is not a file name")
    _check_not_same(p, what, not_same_as)
    try:
        st = os.stat(p)  # follows a symbolic link, as the write does
    except FileNotFoundError:
        st = None
    except OSError as e:  # a parent that is a file, a loop of links ...
        raise InputError(f"{what} {path}: {e.strerror}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} {path} is a directory; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not os.access(p, os.W_OK):  # a device or FIFO: written into, not replaced
            raise InputError(f"{what} {path}: not writable")
        return p
    parent = Path(os.path.realpath(p)).parent
    if not parent.exists():
        raise InputError(f"{what} {path}: directory {p.parent} does not exist")
    if not parent.is_dir():
        raise InputError(f"{what} {path}: {p.parent} is not a directory")
    _probe_writable(parent, what)
    return p


@_naming_option
def check_output_dir(directory, what: str, *, create: bool = False) -> Path:
    """Check that files can be created in ``directory`` (InputError otherwise); return it.
    create=True: the directory may not exist yet (it is made later, with its parents), so its
    nearest existing ancestor must be a directory that takes new entries."""
    d = Path(directory)
    if d.is_dir():
        _probe_writable(d, what)
        return d
    if d.exists() or os.path.lexists(d):
        raise InputError(f"{what} {directory} is not a directory")
    if not create:
        raise InputError(f"{what}: directory {directory} does not exist")
    base = Path(os.path.abspath(d))
    while not base.exists():
        base = base.parent
    if not base.is_dir():
        raise InputError(f"{what} {directory}: {base} is not a directory")
    _probe_writable(base, what)
    return d


DISK_MARGIN = 1.02  # what goes to disk must fit the free space with 2 % to spare
DISK_USES = {"scratch_dir": "scratch", "checkpoint": "checkpoint"}  # RunOptions field: words


def _disk_use(option: str) -> str:
    return DISK_USES.get(option, option.replace("_", " "))


def check_disk(needs) -> None:
    """Before any heavy work: is there disk for what a run writes? ``needs``: (directory, MB,
    option) items, option the ``RunOptions`` field that chose the directory ('scratch_dir',
    'checkpoint'). Each directory must take new files (``check_output_dir``); the MB of the
    directories on one file system are added up and must fit its free space with a 2 % margin.
    InputError (one line; ``option`` 'scratch_dir' when scratch files are among those that do
    not fit, else the item's option)."""
    groups: dict = {}
    for directory, mb, option in needs:
        try:
            d = check_output_dir(directory, f"{_disk_use(option)} directory")
        except InputError as e:
            e.option = e.option or option
            raise
        fs = os.stat(d).st_dev
        first, total, options = groups.get(fs, (d, 0.0, []))
        groups[fs] = (first, total + mb, options + [option])
    for d, mb, options in groups.values():
        free = shutil.disk_usage(d).free / 1e6
        if mb * DISK_MARGIN > free:
            what = " and ".join(sorted({_disk_use(o) for o in options}))
            # more memory keeps B off the scratch disk; a checkpoint holds B whatever the memory
            more = ", or allow more memory (B stays off disk)" if "scratch_dir" in options else ""
            raise InputError(
                f"this run needs {human(mb * DISK_MARGIN)} of disk in {d} ({what}: "
                f"{human(mb)} and a {DISK_MARGIN - 1:.0%} margin) but only {human(free)} are "
                f"free; choose a directory on a larger disk{more}",
                option="scratch_dir" if "scratch_dir" in options else options[0],
            )


# errnos of a write the disk refused: full, over quota, past a file-size limit (ulimit -f), I/O error
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO}


def write_failure(exc: BaseException) -> str | None:
    """The OS's reason when ``exc`` is a write the disk refused (``WRITE_ERRNOS``): an OSError's
    errno, or the 'errno = N' that h5py's OSError and RuntimeError quote from HDF5; else None."""
    if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:
        return os.strerror(exc.errno)  # h5py's strerror is HDF5's whole error stack
    if isinstance(exc, (OSError, RuntimeError)):
        m = re.search(r"errno = (\d+)", str(exc))
        if m and int(m.group(1)) in WRITE_ERRNOS:
            return os.strerror(int(m.group(1)))
    return None


@contextlib.contextmanager
def writing(path, what: str, option: str | None):
    """Turn a write the disk refuses inside the block (``write_failure``) into one DiskWriteError
    line naming ``what`` ('checkpoint', 'scratch file') and ``path``; ``option``: the RunOptions
    field that chose the place ('checkpoint', 'scratch_dir'). Other errors pass unchanged. The
    caller removes what it created (the checkpoint session, the scratch directory)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        why = write_failure(e)
        if why is None:
            raise
        raise DiskWriteError(
            f"cannot write the {what} {path}: {why}; free space there or choose a directory on a larger disk",
            option=option,
        ) from None


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` by the rules in the module docstring; a failure (disk full,
    /dev/full, a vanished directory) is an InputError naming the path, and leaves no temporary
    file and no half-written file behind."""
    _write(path, text, "w")


def json_text(doc, *, indent=None, default=None, where: str = "the document") -> str:
    """``doc`` as strict JSON text (a newline at the end): a NaN or an infinity, which JSON has no
    words for (json.dumps would write NaN or Infinity, which no JSON reader takes), is an InputError
    naming where it is in ``doc`` and ``where`` (the file)."""
    import json

    try:
        return json.dumps(doc, indent=indent, default=default, allow_nan=False) + "\n"
    except ValueError as e:
        if "JSON compliant" not in str(e):
            raise
        raise InputError(
            f"{where}: {_non_finite(doc) or 'a value'} is not a finite number, which JSON cannot carry; nothing written"
        ) from None


def _non_finite(doc, at: str = "") -> str | None:
    """Where the first NaN or infinity in ``doc`` is ('thermo.S_tot[0]'), or None."""
    import math

    if isinstance(doc, float):
        return (at or "the value") if not math.isfinite(doc) else None
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, (list, tuple)) else ()
    for k, v in items:
        found = _non_finite(v, f"{at}[{k}]" if isinstance(k, int) else f"{at}.{k}" if at else str(k))
        if found:
            return found
    return None


def write_json(path, doc, *, indent=None, default=None) -> None:
    """``write_text`` of ``doc`` as strict JSON (``json_text``): a NaN or an infinity is refused
    before anything is written."""
    write_text(path, json_text(doc, indent=indent, default=default, where=str(path)))


def write_bytes(path, data: bytes) -> None:
    """``write_text`` for binary content (a plot)."""
    _write(path, data, "wb")


def _write_stdout(data) -> None:
    """``data`` (text or bytes) on standard output, flushed; a failure is an InputError."""
    try:
        if isinstance(data, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
            sys.stdout.flush()
    except OSError as e:
        raise InputError(f"cannot write to standard output ({e.strerror or e})") from None


def _open_special(p: Path) -> int:
    """A file descriptor for writing into a device or FIFO. A FIFO (a named pipe, or ``>(jq .)``)
    is opened without blocking: with no process reading it, writing would block the finished run
    forever, and the open fails with ENXIO instead (an InputError through ``_write``)."""
    fd = os.open(p, os.O_WRONLY | os.O_NONBLOCK)
    os.set_blocking(fd, True)
    return fd


def _write(path, data, mode: str) -> None:
    if is_stdout(path):
        _write_stdout(data)
        return
    p = Path(path)
    try:
        st = os.stat(p)
    except OSError:
        st = None
    try:
        if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            with open(_open_special(p), mode, closefd=True) as f:  # a device or FIFO: into it, never replacing it
                f.write(data)
            return
        target = Path(os.path.realpath(p))  # replace a link's file, not the link
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        # O_EXCL and mode 0o666: the umask applies, as for any new file (mkstemp would give 0600)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, mode) as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    except OSError as e:
        why = "a FIFO that no process reads" if e.errno == errno.ENXIO else (e.strerror or e)
        raise InputError(f"cannot write {path}: {why}") from None
