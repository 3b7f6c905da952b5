"""XYZ reader.

Format: line 1 the atom count, line 2 a comment (may hold ``charge=N`` and
``multiplicity=M``), then one ``symbol x y z`` line per atom, coordinates in Ångström.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pyscf.data.elements import ELEMENTS

from .errors import InputError

_KNOWN = {s.upper(): s for s in ELEMENTS[1:]}
_CHARGE_RE = re.compile(r"\bcharge\s*=\s*([+-]?\d+)\b", re.IGNORECASE)
_MULT_RE = re.compile(r"\b(?:multiplicity|mult)\s*=\s*([+-]?\d+)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Geometry:
    """A molecule as read from an XYZ file. ``coords_angstrom``: (natm, 3) in Ångström."""

    symbols: tuple
    coords_angstrom: np.ndarray
    charge: int | None = None
    multiplicity: int | None = None
    comment: str = ""
    source: str = ""

    @property
    def natm(self) -> int:
        return len(self.symbols)


def _symbol(token: str, where: str) -> str:
    key = token.strip().upper()
    if key.isdigit():
        z = int(key)
        if 1 <= z < len(ELEMENTS):
            return ELEMENTS[z]
    elif key in _KNOWN:
        return _KNOWN[key]
    raise InputError(f"{where}: unknown element '{token}'")


def parse_xyz(text: str, source: str = "<string>") -> Geometry:
    """Parse XYZ text; errors name the file and line."""
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise InputError(f"{source}:1: expected the atom count on the first line, found "
                         f"{'an empty file' if not lines else 'an empty line'}")
    try:
        natm = int(lines[0].split()[0])
    except ValueError:
        raise InputError(f"{source}:1: expected the atom count on the first line, "
                         f"found '{lines[0].strip()}'") from None
    if natm <= 0:
        raise InputError(f"{source}:1: atom count must be positive, found {natm}")
    comment = lines[1] if len(lines) > 1 else ""
    body = lines[2:]
    while body and not body[-1].strip():
        body.pop()
    if len(body) != natm:
        raise InputError(f"{source}: atom count mismatch: line 1 says {natm} atoms, "
                         f"found {len(body)} atom lines")
    symbols, coords = [], []
    for k, line in enumerate(body, start=3):
        where = f"{source}:{k}"
        parts = line.split()
        if len(parts) < 4:
            raise InputError(f"{where}: expected 'symbol x y z', found '{line.strip()}'")
        symbols.append(_symbol(parts[0], where))
        try:
            xyz = [float(v) for v in parts[1:4]]
        except ValueError:
            raise InputError(f"{where}: coordinates must be numbers, found '{line.strip()}'") from None
        if not all(np.isfinite(xyz)):
            raise InputError(f"{where}: coordinates must be finite, found '{line.strip()}'")
        coords.append(xyz)
    m_c, m_m = _CHARGE_RE.search(comment), _MULT_RE.search(comment)
    return Geometry(symbols=tuple(symbols), coords_angstrom=np.array(coords, dtype=np.float64),
                    charge=int(m_c.group(1)) if m_c else None,
                    multiplicity=int(m_m.group(1)) if m_m else None,
                    comment=comment.strip(), source=source)


def read_xyz(path) -> Geometry:
    """Read an XYZ file; a missing or unreadable file is an InputError."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{path}: no such file")
    if p.is_dir():
        raise InputError(f"{path}: is a directory, expected an .xyz file")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read the file ({e.__class__.__name__})") from None
    return parse_xyz(text, source=str(path))
