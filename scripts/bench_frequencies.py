#!/usr/bin/env python
"""Check: ``dfmp2 frequencies`` (central differences of analytic gradients) against a Hessian from
second differences of our energies alone (the check of the analytic Hessian), at our optimised geometry.

For each molecule: ``dfmp2 optimize`` (geomeTRIC, the default criteria), then the frequencies from
6N + 1 analytic gradients (step ``--step``), then the Hessian from energies only,
    H_ii = (E(+h e_i) - 2 E0 + E(-h e_i)) / h²,
    H_ij = (E(+h e_i + h e_j) - E(+h e_i - h e_j) - E(-h e_i + h e_j) + E(-h e_i - h e_j)) / 4h²,
with its own step ``--energy-step``, both analysed the same way (PySCF's harmonic_analysis with
translations and rotations projected), and the frequencies compared mode by mode.

    python scripts/bench_frequencies.py --molecules water ammonia --basis cc-pvdz

Writes scripts/results/frequencies.json and .md (``--out`` a path stem elsewhere).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks.timing import cpu_model, now
from dfmp2.interfaces.api import run
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import frequencies as F
from dfmp2.workflows.optimize import optimize


def energy_hessian(geom, options: RunOptions, h: float) -> tuple[np.ndarray, int]:
    """(the (3N, 3N) Hessian from second differences of E(MP2), Eh/bohr², energies computed)."""
    n = 3 * geom.natm
    cache = {}

    def E(steps: tuple) -> float:  # steps: ((coordinate, sign), ...)
        key = tuple(sorted(steps))
        if key not in cache:
            g = geom
            for c, s in key:
                g = F.displaced(g, c, s, h)
            r = run(g, options)
            cache[key] = r.e_hf + r.e_corr
        return cache[key]

    H = np.zeros((n, n))
    e0 = E(())
    for i in range(n):
        H[i, i] = (E(((i, 1),)) - 2 * e0 + E(((i, -1),))) / h**2
        for j in range(i):
            H[i, j] = H[j, i] = (
                E(((i, 1), (j, 1))) - E(((i, 1), (j, -1))) - E(((i, -1), (j, 1))) + E(((i, -1), (j, -1)))
            ) / (4 * h * h)
    return H, len(cache)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--molecules", nargs="+", default=["water", "ammonia"])
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--step", type=float, default=F.STEP_BOHR, help="gradient step, bohr")
    ap.add_argument("--energy-step", type=float, default=0.01, help="energy step, bohr")
    ap.add_argument("--out", help="path stem (default scripts/results/frequencies)")
    a = ap.parse_args(argv)
    options = RunOptions(basis=a.basis)
    rows = []
    for name in a.molecules:
        geom = read_xyz(ROOT / "inputs" / f"{name}.xyz")
        t0 = time.perf_counter()
        opt = optimize(geom, options)
        geom = dataclasses.replace(geom, coords_angstrom=np.asarray(opt.geometry.coords_angstrom))
        t1 = time.perf_counter()
        res = F.frequencies(geom, options, step=a.step)
        t2 = time.perf_counter()
        H, nE = energy_hessian(geom, options, a.energy_step)
        t3 = time.perf_counter()
        mol = F.io_molecule.build_molecule(geom, a.basis)
        fromE = np.asarray(F.harmonic(mol, H)["freq_wavenumber"])
        diff = np.abs(res.frequencies - fromE)
        rows.append(
            {
                "molecule": name,
                "optimize_steps": opt.steps,
                "max_abs_gradient": float(np.abs(res.gradient).max()),
                "frequencies_gradients": res.frequencies.tolist(),
                "frequencies_energies": fromE.tolist(),
                "max_abs_difference_cm": float(diff.max()),
                "zero_modes_cm": {k: v.tolist() for k, v in res.zero_modes.items()},
                "ir_km_mol": None if res.ir is None else res.ir.tolist(),
                "hessian_max_abs_difference": float(np.abs(res.hessian - H).max()),
                "energies": nE,
                "seconds": {"optimize": t1 - t0, "frequencies": t2 - t1, "energy_hessian": t3 - t2},
            }
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    doc = {
        "date": now(),
        "machine": {"cpu": cpu_model(), "platform": platform.platform()},
        "versions": software_versions(),
        "basis": a.basis,
        "gradient_step_bohr": a.step,
        "energy_step_bohr": a.energy_step,
        "rows": rows,
    }
    stem = Path(a.out) if a.out else ROOT / "scripts" / "results" / "frequencies"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(markdown(doc)) + "\n")
    print("\n".join(markdown(doc)))
    return 0


def markdown(doc: dict) -> list[str]:
    lines = [
        f"# Frequencies: analytic gradients against energies only, MP2/{doc['basis']}",
        "",
        f"{doc['date']}, {doc['machine']['cpu']}. At dfmp2 optimize's geometry; the gradient Hessian by central "
        f"differences (step {doc['gradient_step_bohr']} bohr), the energy Hessian by second differences (step "
        f"{doc['energy_step_bohr']} bohr); both through PySCF's harmonic_analysis.",
        "",
        "| molecule | max abs g (Eh/bohr) | ν from gradients (cm⁻¹) | ν from energies (cm⁻¹) | max abs Δν (cm⁻¹) "
        "| zero modes, unprojected (cm⁻¹) | IR (km/mol) | energies |",
        "|---|---:|---|---|---:|---|---|---:|",
    ]
    for r in doc["rows"]:
        fg = ", ".join(f"{x:.2f}" for x in r["frequencies_gradients"])
        fe = ", ".join(f"{x:.2f}" for x in r["frequencies_energies"])
        ir = ", ".join(f"{x:.2f}" for x in r["ir_km_mol"]) if r["ir_km_mol"] else "—"
        zm = ", ".join(f"{x:.1f}" for x in r["zero_modes_cm"]["unprojected"]) if r.get("zero_modes_cm") else "—"
        lines.append(
            f"| {r['molecule']} | {r['max_abs_gradient']:.1e} | {fg} | {fe} | {r['max_abs_difference_cm']:.3f} "
            f"| {zm} | {ir} | {r['energies']} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
