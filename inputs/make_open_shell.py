#!/usr/bin/env python
"""Write the open-shell test molecules in inputs/open_shell/ (see inputs/SOURCES.md).

    pip install ase==3.29.0 && python inputs/make_open_shell.py

G2 radicals and triplets: the MP2(full)/6-31G(d) geometries of the G2-1 / G2-2 sets (Curtiss et
al., J. Chem. Phys. 106, 1063 (1997)) as ASE 3.29.0 stores them (ase/data/g2_1.py, g2_2.py).
Ions are vertical: H2O+ at the neutral water geometry (inputs/water.xyz), O2- at the neutral
O2 geometry. Allyl is constructed (planar C2v from stated bond lengths and angles, not
optimised); the glycyl radical is inputs/glycine.xyz without one alpha-H (unrelaxed).
"""

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "open_shell"
G2 = (
    "MP2(full)/6-31G(d) geometry of the G2-{set} set (Curtiss et al., J. Chem. Phys. 106, 1063 "
    "(1997)), from ASE 3.29.0 ase/data/g2_{set}.py"
)


def write(name, symbols, xyz, comment, charge, mult):
    lines = [str(len(symbols)), f"{comment}; charge={charge} multiplicity={mult}"]
    lines += [f"{s:2s} {x:15.8f} {y:15.8f} {z:15.8f}" for s, (x, y, z) in zip(symbols, np.asarray(xyz))]
    (OUT / f"{name}.xyz").write_text("\n".join(lines) + "\n")


def read_xyz(path):
    rows = Path(path).read_text().splitlines()[2:]
    return [r.split()[0] for r in rows if r.strip()], np.array(
        [[float(v) for v in r.split()[1:4]] for r in rows if r.strip()]
    )


def allyl():
    """Planar C2v allyl (C3H5): C-C 1.39 A, CCC 124 deg, C-H 1.08 A, every H-C-C 120-121 deg."""
    cc, ccc, ch = 1.39, np.radians(124.0), 1.08
    half = ccc / 2
    c2 = np.zeros(3)
    c1 = np.array([-cc * np.sin(half), -cc * np.cos(half), 0.0])
    c3 = np.array([cc * np.sin(half), -cc * np.cos(half), 0.0])
    h2 = np.array([0.0, ch, 0.0])  # central H on the C2 axis

    hs = []
    for c, sign in ((c1, 1), (c3, -1)):
        u = (c2 - c) / np.linalg.norm(c2 - c)
        for a in (121.0, -118.0):  # H anti (121) and syn (118) to the central C-H
            t = np.radians(a) * sign
            r = np.array([[np.cos(t), -np.sin(t), 0], [np.sin(t), np.cos(t), 0], [0, 0, 1]])
            hs.append(c + ch * r @ u)
    return ["C", "C", "C", "H", "H", "H", "H", "H"], np.array([c1, c2, c3, h2, *hs])


def main(g2: bool = True):
    """Write every file; ``g2=False``: only those derived from files already here (no ASE needed)."""
    OUT.mkdir(exist_ok=True)
    if g2:
        from ase.data import g2_1, g2_2

        cases = [
            ("hydroxyl", g2_1, "OH", 1, 2),
            ("methyl", g2_1, "CH3", 1, 2),
            ("nitric_oxide", g2_1, "NO", 1, 2),
            ("cyano", g2_1, "CN", 1, 2),
            ("dioxygen_triplet", g2_1, "O2", 1, 3),
            ("methylene_triplet", g2_1, "CH2_s3B1d", 1, 3),
            ("tert_butyl", g2_2, "C3H9C", 2, 2),
        ]
        for name, mod, key, gset, mult in cases:
            d = mod.data[key]
            write(name, _symbols(d["symbols"]), d["positions"], f"{d['description']} {G2.format(set=gset)}", 0, mult)
    s, x = read_xyz(HERE / "open_shell" / "dioxygen_triplet.xyz")
    write("superoxide", s, x, f"Superoxide anion O2-, vertical: the neutral O2 {G2.format(set=1)}", -1, 2)
    s, x = read_xyz(HERE / "water.xyz")
    write(
        "water_cation",
        s,
        x,
        f"Water cation H2O+, vertical: the neutral water geometry of inputs/water.xyz ({G2.format(set=1)})",
        1,
        2,
    )
    s, x = allyl()
    write(
        "allyl",
        s,
        x,
        "Allyl radical C3H5, constructed (not optimised): planar C2v, C-C 1.39 A, "
        "C-C-C 124 deg, C-H 1.08 A, H-C-C 120-121 deg (inputs/make_open_shell.py)",
        0,
        2,
    )
    s, x = read_xyz(HERE / "glycine.xyz")
    keep = [k for k in range(len(s)) if k != 7]  # the 8th atom: one of the two alpha-H
    write(
        "glycyl",
        [s[k] for k in keep],
        x[keep],
        "Glycyl radical NH2-CH-COOH, unrelaxed: inputs/glycine.xyz "
        "(psi4 tests/mints6 @ 886caaabe2) without its second alpha-H (inputs/make_open_shell.py)",
        0,
        2,
    )
    return 0


def _symbols(formula):
    """'CHHH' -> ['C', 'H', 'H', 'H'] (ASE's symbol strings: capital letter + lower-case)."""
    import re

    return re.findall(r"[A-Z][a-z]?", formula)


if __name__ == "__main__":
    main()
