#!/usr/bin/env python
"""Benchmark: what the JK factor's shell-pair screening keeps and what it changes.

For each molecule, ``dfmp2 run`` twice in its own process: every pair kept (``--scf-screen 0``)
and the default threshold (or ``--thresholds``): the pairs kept, the factor's MB packed (kept
against unscreened), the layout, wall time, peak RSS, and E(HF), E_corr against the unscreened run.
Molecules: a water cluster from inputs/water_clusters (compact) and a water chain (``--chain N``:
N waters on a line, O-O ``--spacing`` Å, the same orientation; the far pairs vanish).

    python scripts/bench_screening.py --cluster 16 --chain 16 --memory 2GB

Writes scripts/results/screening.json and .md (``--out`` a path stem elsewhere).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks import fair_baseline as fb
from dfmp2.benchmarks.timing import cpu_model, now, run_dfmp2
from dfmp2.io.result import software_versions
from dfmp2.options import SCF_SCREEN

WATER = [("O", 0.0, 0.0, 0.0), ("H", 0.58588228, 0.53524471, 0.53524471), ("H", 0.58588228, -0.53524471, -0.53524471)]


def chain_xyz(n: int, spacing: float) -> str:
    lines = [str(3 * n), f"(H2O){n} chain, O-O {spacing} A on the x axis; charge=0 multiplicity=1"]
    for k in range(n):
        lines += [f"{s} {x + k * spacing:.8f} {y:.8f} {z:.8f}" for s, x, y, z in WATER]
    return "\n".join(lines) + "\n"


def run_one(xyz: Path, basis: str, memory: str, screen: float, threads: int, timeout: float = 7200) -> dict:
    """One ``dfmp2 run`` in its own process (``timing.run_dfmp2``): wall s, peak RSS MB, energies
    and the JK factor's record from its JSON."""
    run = run_dfmp2(xyz, ["--basis", basis, "--memory", memory, "--scf-screen", repr(screen)], threads, timeout)
    if "error" in run:
        return run
    d = run["result"]
    jf = d["ran"]["scf"]["jk_factor"]
    return {
        "wall_s": run["wall_s"],
        "scf_s": d["timings"].get("scf"),
        "max_rss_mb": run["max_rss_mb"],
        "nbasis": d["shapes"]["nbasis"],
        "e_hf": d["energies"]["e_hf"],
        "e_corr": d["energies"]["e_corr"],
        "layout": jf["layout"],
        "screening": jf["screening"],
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", type=int, nargs="*", default=[16], help="water clusters (inputs/water_clusters)")
    ap.add_argument("--chain", type=int, nargs="*", default=[16], help="water chains of these lengths")
    ap.add_argument("--spacing", type=float, default=2.9, help="O-O distance of the chain, Å")
    ap.add_argument("--thresholds", type=float, nargs="+", default=[SCF_SCREEN])
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--memory", default="2GB")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="path stem (default scripts/results/screening)")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfmp2-chains-") as tmp:
        mols = [(f"(H2O){n} cluster", ROOT / "inputs" / "water_clusters" / f"h2o_{n:02d}.xyz") for n in a.cluster]
        for n in a.chain:
            path = Path(tmp) / f"chain_{n}.xyz"
            path.write_text(chain_xyz(n, a.spacing))
            mols.append((f"(H2O){n} chain, O-O {a.spacing} Å", path))
        for name, xyz in mols:
            every = run_one(xyz, a.basis, a.memory, 0.0, a.threads)
            print(f"{name} every pair: {every}", file=sys.stderr)
            for th in a.thresholds:
                scr = run_one(xyz, a.basis, a.memory, th, a.threads)
                print(f"{name} {th:g}: {scr}", file=sys.stderr)
                rows.append({"molecule": name, "threshold": th, "every_pair": every, "screened": scr})
    doc = {
        "date": now(),
        "machine": {"cpu": cpu_model(), "platform": platform.platform(), "threads": a.threads},
        "blas": fb.blas_info(),
        "versions": software_versions(),
        "basis": a.basis,
        "memory": a.memory,
        "rows": rows,
    }
    stem = Path(a.out) if a.out else ROOT / "scripts" / "results" / "screening"
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(markdown(doc)) + "\n")
    print("\n".join(markdown(doc)))
    return 0


def markdown(doc: dict) -> list[str]:
    lines = [
        f"# JK factor screening: {doc['basis']}, --memory {doc['memory']}",
        "",
        f"{doc['date']}, {doc['machine']['cpu']}, {doc['machine']['threads']} threads. {fb.blas_summary(doc['blas'])}. "
        "Each run in its own process; RSS = the process's peak resident set.",
        "",
        "| molecule | nbasis | threshold | pairs kept | factor MB kept / every pair | layout | |ΔE(HF)| Eh "
        "| |ΔE_corr| Eh | wall s (every pair → screened) | peak RSS MB |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in doc["rows"]:
        e, s = r["every_pair"], r["screened"]
        if "error" in e or "error" in s:
            lines.append(f"| {r['molecule']} | | {r['threshold']:g} | {e.get('error') or s.get('error')} | | | | | | |")
            continue
        sc = s["screening"]
        lines.append(
            f"| {r['molecule']} | {s['nbasis']} | {r['threshold']:g} | {sc['pairs_kept']} of {sc['pairs_total']} "
            f"({100 * sc['pairs_kept'] / sc['pairs_total']:.0f} %) | {sc['kept_mb']:.0f} / {sc['unscreened_mb']:.0f} | "
            f"{e['layout']} → {s['layout']} | {abs(s['e_hf'] - e['e_hf']):.1e} | {abs(s['e_corr'] - e['e_corr']):.1e} | "
            f"{e['wall_s']:.1f} → {s['wall_s']:.1f} | {e['max_rss_mb']:.0f} → {s['max_rss_mb']:.0f} |"
        )
    return lines


if __name__ == "__main__":
    sys.exit(main())
