#!/usr/bin/env python
"""Benchmark: one DF-MP2 gradient against one DF-MP2 energy on the same molecule and options.

``energy``: ``dfmp2.interfaces.api.run`` (``dfmp2 run``: SCF + MP2). ``gradient``: ``run_gradient``
(``dfmp2 gradient``: the same energy run, then the gradient stage); its gradient stage alone is
reported too, with its parts (densities and pair loop, Z-vector, derivative integrals). The ratio
gradient / energy is the figure of the issue (the literature's 2-4 energies). Runs are interleaved
(energy, gradient) ``--repeat`` times after one warm-up each; median, min and max. Every row records
the other processes' CPU use while it ran (a shared machine slows both).

    python scripts/bench_gradient.py inputs/water_clusters/h2o_08.xyz
    python scripts/bench_gradient.py inputs/water_clusters/h2o_16.xyz --threads 16 --repeat 3
    python scripts/bench_gradient.py inputs/water_clusters/h2o_08.xyz --charge 1 --multiplicity 2 --tag cation
    python scripts/bench_gradient.py inputs/water_clusters/h2o_08.xyz --method b2plyp --tag b2plyp

A double hybrid (``--method`` one of dfmp2.functionals.FUNCTIONALS) compares ``dfmp2 run --method``
(KS-SCF + PT2 + dispersion) with ``dfmp2 gradient --method`` (the same, then dfmp2.grad.dh).

Writes scripts/results/gradient_<molecule>[_<tag>].json and .md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks.timing import OtherCPU, cpu_model
from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.functionals import FUNCTIONALS
from dfmp2.interfaces import api
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions


def timed(fn):
    m0 = OtherCPU.mark()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out, OtherCPU.cores(m0, OtherCPU.mark())


def stats(xs: list) -> dict:
    return {"median_s": statistics.median(xs), "min_s": min(xs), "max_s": max(xs), "n": len(xs)}


def stage_name(dh: bool, spin: int) -> str:
    """The gradient stage that ran: dfmp2.grad.dh for a double hybrid, else the (U)MP2 one."""
    return "dfmp2.grad.dh" if dh else "dfmp2.grad.ump2" if spin else "dfmp2.grad.mp2"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xyz")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--method", default="mp2", choices=("mp2", "scs-mp2", "sos-mp2", *FUNCTIONALS))
    ap.add_argument("--frozen-core", action="store_true")
    ap.add_argument("--charge", type=int, default=None, help="default: the XYZ comment line's, else 0")
    ap.add_argument("--multiplicity", type=int, default=None, help="2S+1 (> 1: a UHF reference)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-warmup", action="store_true", help="skip the warm-up runs (tiny checks)")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out", default=str(ROOT / "scripts" / "results"))
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    geom = read_xyz(a.xyz)
    dh = a.method in FUNCTIONALS  # a double hybrid: its energy is dfmp2 run --method's
    options = RunOptions(
        basis=a.basis,
        frozen_core=a.frozen_core,
        device=a.device,
        charge=a.charge,
        multiplicity=a.multiplicity,
        method=a.method if dh else "mp2",
    )
    backend = energy_driver.make_backend(options, unrestricted=(a.multiplicity or 1) > 1)
    energy = lambda: api.run(geom, options, backend=backend)
    gradient = lambda: gradient_driver.run_gradient(geom, options, method=a.method, backend=backend)
    if not a.no_warmup:
        energy(), gradient()
    rows = {"energy": [], "gradient": [], "gradient_stage": []}
    other, parts = [], []
    for _ in range(a.repeat):
        t, r, o = timed(energy)
        rows["energy"].append(t)
        other.append({"run": "energy", **(o or {})})
        t, gr, o = timed(gradient)
        rows["gradient"].append(t)
        rows["gradient_stage"].append(gr.wall_s)
        parts.append(gr.parts.timings)
        other.append({"run": "gradient", **(o or {})})
    s = {k: stats(v) for k, v in rows.items()}
    ratio = s["gradient"]["median_s"] / s["energy"]["median_s"]
    name = Path(a.xyz).stem
    record = {
        "molecule": a.xyz,
        "basis": a.basis,
        "method": a.method,
        "frozen_core": a.frozen_core,
        "shapes": {"natm": r.natm, "nbasis": r.nbasis, "nocc": r.nocc, "nvir": r.nvir, "naux": r.naux},
        "times": s,
        "ratio_gradient_over_energy": ratio,
        "ratio_gradient_stage_over_energy": s["gradient_stage"]["median_s"] / s["energy"]["median_s"],
        "gradient_stage_parts_s": parts,
        "other_cpu": other,
        "ran": {
            "device": r.ran["device"],
            "engine": r.ran["engine"],
            "precision": r.ran["precision"],
            "reference": ("UKS" if r.spin else "RKS") if dh else ("UHF" if r.spin else "RHF"),
            "gradient": {"stage": stage_name(dh, r.spin), **gr.parts.to_dict()["ran"]},
        },  # the stage's own record of what ran where
        "threads": torch.get_num_threads(),
        "cpu": cpu_model(),
        "machine": platform.node(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "versions": software_versions(),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"gradient_{name.replace('_', '')}" + (f"_{a.tag}" if a.tag else "")
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2) + "\n")
    md = [
        f"# gradient vs energy: {name} / {a.basis} ({a.method}{', frozen core' if a.frozen_core else ''})",
        "",
        f"{record['date']}, {record['cpu']}, {record['threads']} threads, device {r.ran['device']}",
        "",
        "| run | median / s | min / s | max / s |",
        "|---|---|---|---|",
    ]
    md += [f"| {k} | {v['median_s']:.3f} | {v['min_s']:.3f} | {v['max_s']:.3f} |" for k, v in s.items()]
    md += [
        "",
        f"gradient / energy = {ratio:.2f} (the gradient stage alone: "
        f"{record['ratio_gradient_stage_over_energy']:.2f} energies)",
        "",
    ]
    (out / f"{stem}.md").write_text("\n".join(md))
    print("\n".join(md))
    print(f"wrote {out / stem}.json and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
