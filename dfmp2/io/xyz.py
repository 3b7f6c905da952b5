"""XYZ reader.

Format: line 1 the atom count, line 2 a comment (may hold ``charge=N`` and
``multiplicity=M``, also written ``charge: N`` or ``charge N``, integers, each once, or be the two
integers ``N M`` alone; ``spin=`` and near-misses of those keys are refused, other words are free
text; options override them), then one ``symbol x y z`` line per atom, coordinates in Ångström.
The symbol may be an atomic number. A line with more than four fields is refused rather than
guessed at: extended-XYZ files put other things in those columns (``O 8 0.0 0.0 0.119`` is an
atomic number before the coordinates, other writers append charges or forces). Coordinates
must be finite and within ``MAX_COORD_ANGSTROM``. One molecule: a multi-frame XYZ (a trajectory) is
refused in one line naming its frames.

Fragments (``dfmp2 interaction``), Psi4's convention: a line ``--`` between the atom lines of two
fragments; each fragment may open with a line ``charge multiplicity`` (two integers, e.g. ``-1 1``),
for every fragment or for none. These lines are not atoms (line 1 counts atoms only);
``Geometry.fragments`` then holds each fragment's atom indices (0-based) and
``Geometry.fragment_states`` their (charge, multiplicity). Other commands run the whole molecule.
"""

from __future__ import annotations

import difflib
import os
import re
import stat
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf.data.elements import ELEMENTS

from dfmp2.errors import InputError, file_kind, shown

_KNOWN = {s.upper(): s for s in ELEMENTS[1:]}
# the value is everything up to a space, comma or semicolon, so 'charge=2.5' is seen whole and
# refused instead of being read as 2
# 'charge=1', 'charge: 1' and 'charge 1' (a number after the word: 'charge 1, multiplicity 2');
# 'charge state' and 'charged' are free text
_VALUE = r"\s*(?:[=:]\s*|\s(?=\s*[+-]?[0-9.]))([^\s,;]*)"
_CHARGE_RE = re.compile(r"\bcharge" + _VALUE, re.IGNORECASE)
_MULT_RE = re.compile(r"\b(?:multiplicity|mult)" + _VALUE, re.IGNORECASE)
_INT_RE = re.compile(r"[+-]?([0-9]+)", re.ASCII)
MAX_STATE_DIGITS = 6  # |charge| and multiplicity up to 999999: beyond any molecule
_KEY_RE = re.compile(r"(?<![\w.-])([A-Za-z][\w-]*)\s*=")  # 'key=' anywhere on the comment line
_STATE_KEYS = ("charge", "multiplicity", "mult")
_COUNT_RE = re.compile(r"[+-]?[0-9]{1,9}", re.ASCII)
_STATE_RE = re.compile(r"\s*([+-]?[0-9]{1,6})\s+([+-]?[0-9]{1,6})\s*", re.ASCII)  # 'charge mult'
STDIN = "-"  # the input path that means standard input
STDIN_NAME = "stdin"  # such an input's name in captions and results
MAX_INPUT_BYTES = 64 * 1000**2  # 64 MB: a million atom lines; an input is read whole, so bounded
MAX_COORD_ANGSTROM = 1e5  # 10 µm: far beyond any molecule, well inside where r² stays finite


@dataclass(frozen=True)
class Geometry:
    """A molecule as read from an XYZ file. ``coords_angstrom``: (natm, 3) in Ångström."""

    symbols: tuple
    coords_angstrom: np.ndarray
    charge: int | None = None
    multiplicity: int | None = None
    comment: str = ""
    source: str = ""
    fragments: tuple = ()  # ((0-based atom indices), ...) from '--' lines; () when none
    fragment_states: tuple = ()  # ((charge, multiplicity), ...) from the fragments' lines; () when none
    ghost: tuple = ()  # per atom, True for a ghost atom (basis functions only); () when none

    @property
    def natm(self) -> int:
        return len(self.symbols)

    def is_ghost(self, i: int) -> bool:
        return bool(self.ghost) and bool(self.ghost[i])

    @property
    def real_symbols(self) -> tuple:
        """The symbols of the atoms that are not ghosts (they carry the charge and electrons)."""
        return tuple(s for i, s in enumerate(self.symbols) if not self.is_ghost(i))


def _symbol(token: str, where: str) -> str:
    key = token.strip().upper()
    if key.isascii() and key.isdigit():
        z = int(key)
        if 1 <= z < len(ELEMENTS):
            return ELEMENTS[z]
    elif key in _KNOWN:
        return _KNOWN[key]
    raise InputError(f"{where}: unknown element '{shown(token, 20)}'")


def parse_xyz(text: str, source: str = "<string>") -> Geometry:  # noqa: C901
    """Parse XYZ text; errors name the file and line."""
    # only \n (and \r\n, \r) end a line, so line numbers are the ones an editor shows
    text = text[1:] if text.startswith("\ufeff") else text  # a UTF-8 byte-order mark
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines or not lines[0].strip():
        raise InputError(
            f"{source}:1: expected the atom count on the first line, found "
            f"{'an empty file' if not lines else 'an empty line'}"
        )
    count = lines[0].split()[0]
    if not _COUNT_RE.fullmatch(count):
        raise InputError(f"{source}:1: expected the atom count on the first line, found '{shown(lines[0])}'")
    natm = int(count)
    if natm <= 0:
        raise InputError(f"{source}:1: atom count must be positive, found {natm}")
    comment = lines[1] if len(lines) > 1 else ""
    body = lines[2:]
    while body and not body[-1].strip():
        body.pop()
    numbered = list(enumerate(body, start=3))
    fragments = states = ()
    if any(line.strip() == "--" for _, line in numbered):
        numbered, fragments, states = _fragments(numbered, source)
    if len(numbered) != natm:
        _check_frames(lines, natm, source)
        raise InputError(f"{source}: atom count mismatch: line 1 says {natm} atoms, found {len(numbered)} atom lines")
    symbols, coords = [], []
    for k, line in numbered:
        where = f"{source}:{k}"
        parts = line.split()
        if len(parts) < 4:
            raise InputError(f"{where}: expected 'symbol x y z', found '{shown(line)}'")
        if len(parts) > 4:
            raise InputError(
                f"{where}: expected 'symbol x y z' (4 fields), found {len(parts)} "
                f"fields in '{shown(line)}'; remove the extra columns"
            )
        symbols.append(_symbol(parts[0], where))
        try:
            if any("_" in v for v in parts[1:]):  # float() would read '1_0' as 10
                raise ValueError
            xyz = [float(v) for v in parts[1:4]]
        except ValueError:
            raise InputError(f"{where}: coordinates must be numbers, found '{shown(line)}'") from None
        if not all(np.isfinite(xyz)):
            raise InputError(f"{where}: coordinates must be finite, found '{shown(line)}'")
        if max(abs(v) for v in xyz) > MAX_COORD_ANGSTROM:
            raise InputError(f"{where}: coordinates must be within ±{MAX_COORD_ANGSTROM:g} Å, found '{shown(line)}'")
        coords.append(xyz)
    charge, multiplicity = comment_state(comment, f"{source}:2")
    return Geometry(
        symbols=tuple(symbols),
        coords_angstrom=np.array(coords, dtype=np.float64),
        charge=charge,
        multiplicity=multiplicity,
        comment=comment.strip(),
        source=source,
        fragments=fragments,
        fragment_states=states,
    )


def _fragments(numbered, source: str) -> tuple:
    """Split (line number, text) body lines at '--' lines. Returns (atom lines, the atom indices
    (0-based) of each fragment, each fragment's (charge, multiplicity) from a 'charge mult' line
    opening it, or () when no fragment has one). A '--' first, last or right after another leaves
    a fragment without atoms; a 'charge mult' line on some fragments only; both refused with the
    line number."""
    atom_lines: list = []
    out: list = []
    states: list = []
    current: list = []
    state, opening, last = None, True, None
    for k, line in numbered:
        if line.strip() == "--":
            if not current:
                where = "before it" if not out else "between it and the '--' above"
                raise InputError(f"{source}:{k}: fragment separator '--' with no atom lines {where}")
            out.append(tuple(current))
            states.append(state)
            current, state, opening, last = [], None, True, k
            continue
        m = _STATE_RE.fullmatch(line) if opening else None
        opening = False
        if m is not None:
            mult = int(m.group(2))
            if mult < 1:
                raise InputError(f"{source}:{k}: multiplicity must be 1 or more (2S+1), found {mult}")
            state = (int(m.group(1)), mult, k)
            continue
        current.append(len(atom_lines))
        atom_lines.append((k, line))
    if not current:
        raise InputError(f"{source}:{last}: fragment separator '--' with no atom lines after it")
    out.append(tuple(current))
    states.append(state)
    given = [st for st in states if st is not None]
    if given and len(given) < len(states):
        n = next(i for i, st in enumerate(states) if st is None)
        raise InputError(
            f"{source}:{given[0][2]}: fragment {n + 1} has no 'charge multiplicity' "
            "line; give one at the start of every fragment or of none"
        )
    return atom_lines, tuple(out), tuple((q, m) for q, m, _ in given)


def comment_state(comment: str, where: str) -> tuple:
    """(charge, multiplicity) of the comment line, each None when not given: ``charge=1``,
    ``charge: 1`` or ``charge 1`` (and ``multiplicity``/``mult`` alike), or the line ``1 2`` alone
    (two integers: charge and multiplicity, as a fragment's line and Psi4's molecule string)."""
    _check_comment_keys(comment, where)
    m = _STATE_RE.fullmatch(comment)
    if m is not None:
        mult = int(m.group(2))
        if mult < 1:
            raise InputError(f"{where}: multiplicity must be 1 or more (2S+1), found {mult} ('charge multiplicity')")
        return int(m.group(1)), mult
    return _comment_int(_CHARGE_RE, comment, "charge", where), _comment_int(_MULT_RE, comment, "multiplicity", where)


def _check_frames(lines: list, natm: int, source: str) -> None:
    """InputError for a multi-frame XYZ (a trajectory: another atom count line after the first
    frame's atoms), which the atom count check would call a mismatch."""
    starts, pos = [], 0
    while pos < len(lines) and lines[pos].split() and _COUNT_RE.fullmatch(lines[pos].split()[0]):
        n = int(lines[pos].split()[0])
        if n <= 0:
            break
        starts.append(pos + 1)
        pos += n + 2
    if len(starts) < 2:
        return
    frames = f"{len(starts)} frames" if pos == len(lines) else f"{len(starts)} frames or more"
    raise InputError(
        f"{source}: multi-frame XYZ: {frames} (line {starts[1]} starts the second); dfmp2 "
        f"reads one molecule: give one frame in its own file (the first: head -n {natm + 2} {source})"
    )


def _check_comment_keys(comment: str, where: str) -> None:
    """Refuse the ``key=value`` words that look like a molecule's state but would be ignored:
    ``spin=`` (2S in PySCF, S in other programs: ambiguous) and near-misses of charge and
    multiplicity (``chrage=``). Other ``key=value`` words are free text (extended-XYZ writers put
    ``Lattice=``, ``Properties=`` or ``energy=`` there), as is everything else."""
    for key in _KEY_RE.findall(comment):
        k = key.lower()
        if k in _STATE_KEYS:
            continue
        if k == "spin":
            raise InputError(
                f"{where}: '{shown(key, 20)}=' is not read (2S or S?); give the spin "
                "as multiplicity=2S+1 (e.g. multiplicity=3 for a triplet)"
            )
        near = difflib.get_close_matches(k, _STATE_KEYS, n=1, cutoff=0.75)
        if near:
            raise InputError(f"{where}: unknown key '{shown(key, 20)}='; did you mean '{near[0]}='?")


def _comment_int(regex, comment: str, what: str, where: str) -> int | None:
    """The integer after ``what=`` on the comment line, None when absent; anything but an
    integer (2.5, 2e0, +) is an error rather than a truncation."""
    found = regex.findall(comment)
    if not found:
        return None
    if len(found) > 1:
        raise InputError(
            f"{where}: {what} is given {len(found)} times "
            f"({', '.join(repr(shown(v, 12)) for v in found)}); give it once"
        )
    value = found[0]
    m = _INT_RE.fullmatch(value)
    if m is None:
        raise InputError(f"{where}: {what} must be an integer, found '{shown(value, 30)}'")
    if len(m.group(1).lstrip("0")) > MAX_STATE_DIGITS:
        bound = ("±" if what == "charge" else "") + "9" * MAX_STATE_DIGITS
        raise InputError(f"{where}: {what} {shown(value, 30)} is out of range (at most {bound})")
    n = int(value)
    if what == "multiplicity" and n < 1:
        raise InputError(f"{where}: multiplicity must be 1 or more (2S+1), found {n}")
    return n


def read_input_text(path, expected: str, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The UTF-8 text of an input file, at most ``max_bytes`` bytes; a missing file, a directory
    (``expected`` names what was expected instead, e.g. 'an .xyz file'), a device or socket
    (/dev/zero would be read until memory runs out), a larger file, non-UTF-8 bytes or a read error
    is an InputError. A FIFO is read (``<(...)``, ``/dev/stdin`` from a pipe), up to the bound."""
    if str(path) == "":
        raise InputError(f"the input path is empty; expected {expected}")
    if str(path) == STDIN:
        return _decode(_read_stdin(max_bytes, expected), STDIN_NAME)
    p = Path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read the file ({e.strerror or e.__class__.__name__})") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: is a directory, expected {expected}")
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise InputError(f"{path}: is {file_kind(st.st_mode)}, not a file; expected {expected}")
    too_big = f"{path}: larger than {max_bytes / 1e6:g} MB, far more than any molecule; expected {expected}"
    if st.st_size > max_bytes:  # a regular file's size is known before reading it
        raise InputError(too_big)
    try:
        with open(p, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as e:
        raise InputError(f"{path}: cannot read the file ({e.strerror or e.__class__.__name__})") from None
    except MemoryError:
        raise InputError(f"{path}: not enough memory to read the file") from None
    if len(data) > max_bytes:
        raise InputError(too_big)
    return _decode(data, path)


def _read_stdin(max_bytes: int, expected: str) -> bytes:
    """Standard input's bytes (``-``), read once to its end, at most ``max_bytes``."""
    stream = getattr(sys.stdin, "buffer", None)
    try:
        data = stream.read(max_bytes + 1) if stream is not None else sys.stdin.read(max_bytes + 1).encode()
    except (OSError, ValueError) as e:  # closed or unreadable (ValueError: a closed file)
        raise InputError(f"{STDIN_NAME}: cannot read standard input ({getattr(e, 'strerror', None) or e})") from None
    if len(data) > max_bytes:
        raise InputError(
            f"{STDIN_NAME}: more than {max_bytes / 1e6:g} MB, far more than any molecule; expected {expected}"
        )
    if not data.strip():
        raise InputError(f"{STDIN_NAME}: standard input is empty; expected {expected} (cat water.xyz | dfmp2 run -)")
    return data


def _decode(data: bytes, path) -> str:
    """An input's bytes as text: UTF-8 (InputError otherwise), no BOM, newlines as text mode reads them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputError(f"{path}: not a text file (byte {e.start} is not UTF-8)") from None
    text = text[1:] if text.startswith("\ufeff") else text  # a BOM (Windows editors) is no text
    return text.replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads it


def read_xyz(path) -> Geometry:
    """Read an XYZ file, or standard input for ``-`` (``STDIN``; the molecule is then named
    'stdin'); a missing or unreadable file is an InputError."""
    return parse_xyz(read_input_text(path, "an .xyz file"), source=STDIN_NAME if str(path) == STDIN else str(path))
