#!/usr/bin/env python
"""Benchmark: the SCF's starting guess. Our DF-RHF (or DF-UHF with ``--charge/--multiplicity``)
from each guess to the run's thresholds (orbital gradient 1e-9, |ΔE| < 1e-12 Eh): cycles, J/K
builds (cycles + the guess's build + the final check's), the guess's own seconds and the SCF's.

Guesses: 'minao' (today's, PySCF's default: the SCF's own path), 'sap' (PySCF's superposition of
atomic potentials, basis sapgrasplarge: Lehtola, JCTC 15, 1593 (2019)), 'huckel' (PySCF's
Hückel guess), 'proj:<basis>' (Psi4's BASIS_GUESS: our DF-SCF in the small basis converged to a
gradient of 1e-4, its occupied orbitals projected (PySCF's project_mo_nr2nr) and
re-orthonormalised). A guess other than minao enters as a starting density (``run_scf(dm0=...)``).

    python scripts/bench_scf_guess.py inputs/water_clusters/h2o_08.xyz --guess minao,sap --repeat 3

Prints one line per run and appends them to ``--out`` (JSON lines). Cycle counts are
deterministic; seconds on a shared machine are not (repeat, and read the spread).
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from pyscf import gto, lib, scf

from dfmp2 import linalg
from dfmp2.benchmarks.timing import cpu_model
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.scf import driver
from dfmp2.scf.settings import SCFSettings

SMALL_GRAD = 1e-4  # the projected guess's small-basis SCF: converged this far (Psi4 converges it loosely too)


def guess_density(mol, guess: str, backend, unrestricted: bool):
    """The starting density of guess ``guess`` (None: the SCF's own minao)."""
    if guess == "minao":
        return None
    if guess in ("sap", "huckel"):
        mf = scf.UHF(mol) if unrestricted else scf.RHF(mol)
        return mf.init_guess_by_sap() if guess == "sap" else mf.init_guess_by_huckel()
    if guess.startswith("proj:"):
        small = mol.copy()
        small.basis = guess[5:]
        small.build()
        settings = SCFSettings(precision="fp64", conv_tol=1e-6, conv_tol_grad=SMALL_GRAD, unrestricted=unrestricted)
        ref = driver.run_scf(small, backend, settings)
        Cs = [scf.addons.project_mo_nr2nr(small, ch.mo_coeff[:, : ch.nocc], mol) for ch in ref.channels]
        if not unrestricted:
            C = Cs[0]
            return lib.tag_array(2.0 * C @ C.T, mo_coeff=C, mo_occ=np.full(C.shape[1], 2.0))
        return np.stack([C @ C.T for C in Cs])
    raise SystemExit(f"error: unknown guess '{guess}'")


def time_guesses(mol, a, backend, uhf: bool, meta: dict) -> None:
    """Each guess's seconds alone (minao: PySCF's init_guess_by_minao, what the SCF calls), ``--guess-cost``
    times: median, min, max."""
    for name in a.guess.split(","):
        ts = []
        for _ in range(a.guess_cost):
            t0 = time.perf_counter()
            if name == "minao":
                (scf.UHF(mol) if uhf else scf.RHF(mol)).get_init_guess(key="minao")
            else:
                guess_density(mol, name, backend, uhf)
            ts.append(time.perf_counter() - t0)
        row = {"molecule": Path(a.xyz).stem, "guess": name, "guess_cost_s": [round(t, 3) for t in ts]}
        row["median_s"] = round(float(np.median(ts)), 3)
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps({**row, **meta}) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("xyz")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--guess", default="minao,sap,huckel,proj:3-21g")
    ap.add_argument("--precision", default="fp64")
    ap.add_argument("--charge", type=int, default=0)
    ap.add_argument("--multiplicity", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="append the rows here (JSON lines)")
    ap.add_argument("--guess-cost", type=int, default=0, help="only time each guess alone, this many times")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    geo = read_xyz(a.xyz)
    atoms = list(zip(geo.symbols, geo.coords_angstrom))
    mol = gto.M(atom=atoms, basis=a.basis, charge=a.charge, spin=a.multiplicity - 1, verbose=0)
    uhf = a.multiplicity != 1
    backend = linalg.get_backend("cpu")
    settings = SCFSettings(precision=a.precision, unrestricted=uhf)
    meta = {
        "machine": cpu_model(),
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "versions": software_versions(),
        "threads": a.threads,
    }
    if a.guess_cost:
        return time_guesses(mol, a, backend, uhf, meta)
    for _ in range(a.repeat):
        for name in a.guess.split(","):
            t0 = time.perf_counter()
            dm0 = guess_density(mol, name, backend, uhf)
            t_guess = time.perf_counter() - t0
            t1 = time.perf_counter()
            ref = driver.run_scf(mol, backend, settings, dm0=dm0)
            t_scf = time.perf_counter() - t1
            row = {
                "molecule": Path(a.xyz).stem,
                "basis": a.basis,
                "reference": "UHF" if uhf else "RHF",
                "guess": name,
                "cycles": ref.scf.iterations,
                "jk_builds": ref.scf.iterations + 2,
                "guess_s": round(t_guess, 3),  # outside the SCF (0 for minao: the SCF's own)
                "scf_guess_s": round(ref.scf.times.get("scf_guess", 0.0), 3),  # inside: minao, or projecting
                "scf_s": round(t_scf, 3),
                "e_hf": ref.e_hf,
                **meta,
            }
            print(json.dumps({k: v for k, v in row.items() if k != "versions"}), flush=True)
            if a.out:
                with open(a.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
