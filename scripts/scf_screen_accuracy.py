#!/usr/bin/env python
"""Measurement: what ``--scf-screen`` (the JK factor's Schwarz threshold) does to E(HF), E(MP2)
and the analytic gradient, on small molecules, against the unscreened run (threshold 0).

For each molecule, basis and threshold: E(HF) and E(MP2) minus the unscreened run's, the analytic
gradient's largest difference from the unscreened analytic gradient (itself within 1.4e-7
Eh/bohr of finite differences of PySCF's energies), and the analytic gradient against central
finite differences (step ``--step`` bohr) of the same threshold's own energy on ``--coords``
Cartesian coordinates (those of the largest unscreened gradient): whether the gradient is still
that of the energy the run reports. The FD error of the unscreened energy is the floor.

    python scripts/scf_screen_accuracy.py
    python scripts/scf_screen_accuracy.py --energies inputs/water_clusters/h2o_08.xyz --out .../scf_screen_h2o08.json

``--energies XYZ`` (cc-pVDZ): E(HF) and E(MP2) only, on that molecule instead of the small cases.

Writes scripts/results/scf_screen.json (``--out`` a path elsewhere); the record is scf_screen.md.
The bound this measurement set (``dfmp2.options.SCF_SCREEN_MAX``) is lifted here (``options``), to
measure past it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
BOHR = 0.52917721092  # Å per bohr (PySCF's)
THRESHOLDS = (0.0, 1e-12, 1e-10, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2)
CASES = (
    ("water", "inputs/water.xyz", "cc-pvdz"),
    ("water", "inputs/water.xyz", "aug-cc-pvdz"),
    ("water dimer", "inputs/s22/s22_02_water_dimer.xyz", "cc-pvdz"),
    ("water dimer", "inputs/s22/s22_02_water_dimer.xyz", "aug-cc-pvdz"),
)


def options(basis: str, screen: float):
    """RunOptions at ``screen``, past the bound (RunOptions') this measures."""
    from dfmp2.options import RunOptions

    o = RunOptions(basis=basis)
    o.scf_screen = screen
    return o


def energy(geom, basis: str, screen: float) -> float:
    from dfmp2.interfaces import api

    return float(api.run(geom, options(basis, screen)).e_mp2)


def measure(geom, basis: str, screen: float, coords, step: float) -> dict:
    from dfmp2.drivers.gradient import run_gradient

    g = run_gradient(geom, options(basis, screen))
    scr = g.result.to_dict()["ran"]["scf"]["jk_factor"].get("screening") or {}
    out = {
        "threshold": screen,
        "e_hf": float(g.result.e_hf),
        "e_mp2": float(g.energy),
        "gradient": np.asarray(g.gradient).tolist(),
        "pairs_kept": scr.get("pairs_kept"),
        "pairs_total": scr.get("pairs_total"),
        "fd": {},
    }
    x0 = np.asarray(geom.coords_angstrom, dtype=float)
    for c in coords:
        e = []
        for sign in (1, -1):
            x = x0.copy()
            x.flat[c] += sign * step * BOHR
            e.append(energy(dataclasses.replace(geom, coords_angstrom=x), basis, screen))
        out["fd"][str(c)] = (e[0] - e[1]) / (2 * step)
    return out


def main(argv=None) -> int:
    from dfmp2.benchmarks.timing import cpu_model, now
    from dfmp2.drivers.gradient import run_gradient
    from dfmp2.io.molecule import build_molecule
    from dfmp2.io.result import software_versions
    from dfmp2.io.xyz import read_xyz
    from dfmp2.scf.jk import significant_pairs

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--step", type=float, default=1e-3, help="central-difference step, bohr")
    ap.add_argument("--coords", type=int, default=2, help="Cartesian coordinates differentiated per case")
    ap.add_argument("--out", default=str(ROOT / "scripts/results/scf_screen.json"))
    ap.add_argument("--energies", default=None, help="an XYZ: energies only, cc-pVDZ, at every threshold")
    args = ap.parse_args(argv)
    rows = []
    if args.energies:
        geom = read_xyz(args.energies)
        ref = None
        for t in THRESHOLDS:
            from dfmp2.interfaces import api

            r = api.run(geom, options("cc-pvdz", t))
            scr = r.to_dict()["ran"]["scf"]["jk_factor"].get("screening") or {}
            m = {"threshold": t, "e_hf": float(r.e_hf), "e_mp2": float(r.e_mp2), "pairs_kept": scr.get("pairs_kept")}
            ref = ref or m
            m.update(d_e_hf=m["e_hf"] - ref["e_hf"], d_e_mp2=m["e_mp2"] - ref["e_mp2"], molecule=args.energies)
            rows.append(m)
            print(f"{t:8.0e} pairs {m['pairs_kept']}/{scr.get('pairs_total')} dE(HF) {m['d_e_hf']:+.3e}", flush=True)
    for name, path, basis in () if args.energies else CASES:
        geom = read_xyz(ROOT / path)
        mol = build_molecule(geom, basis)
        g0 = run_gradient(geom, options(basis, 0.0)).gradient
        coords = [int(c) for c in np.argsort(-np.abs(np.asarray(g0).ravel()))[: args.coords]]
        ref = None
        for t in THRESHOLDS:
            if ref is not None and significant_pairs(mol, t) is None:  # every pair kept: the unscreened run
                print(f"{name:12s} {basis:12s} {t:8.0e} every pair kept (the unscreened run)", flush=True)
                rows.append({**ref, "threshold": t, "same_as_unscreened": True})
                continue
            m = measure(geom, basis, t, coords, args.step)
            ref = ref or m
            g, g0 = np.asarray(m["gradient"]), np.asarray(ref["gradient"])
            m.update(
                molecule=name,
                basis=basis,
                d_e_hf=m["e_hf"] - ref["e_hf"],
                d_e_mp2=m["e_mp2"] - ref["e_mp2"],
                d_grad_vs_unscreened=float(np.abs(g - g0).max()),
                d_grad_vs_fd=max(abs(g.flat[int(c)] - v) for c, v in m["fd"].items()),
            )
            rows.append(m)
            print(
                f"{name:12s} {basis:12s} {t:8.0e} pairs {m['pairs_kept']}/{m['pairs_total']} dE(HF) "
                f"{m['d_e_hf']:+.3e} dE(MP2) {m['d_e_mp2']:+.3e} |g-g0| {m['d_grad_vs_unscreened']:.2e} "
                f"|g-FD| {m['d_grad_vs_fd']:.2e}",
                flush=True,
            )
    record = {
        "date": now(),
        "cpu": cpu_model(),
        "command": "python scripts/scf_screen_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "step_bohr": args.step,
        "versions": software_versions(),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
