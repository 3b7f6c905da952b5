#!/usr/bin/env python3
"""``dfmp2 interaction`` dealt over ranks against one process, with the launcher's own cost
measured apart.

Per basis, interleaved over ``--repeat`` rounds, each a fresh command timed from outside (wall,
start-ups included):

- ``plain``: ``python -m dfmp2 interaction`` (one process, ``--threads`` threads), and ``plain 1
  thread``, the ranks' threads (the energies' reference);
- ``torchrun 1``: the same under ``torchrun --nproc-per-node 1`` (OMP_NUM_THREADS = threads);
- ``torchrun N``: ``--ranks`` ranks of one thread each (torchrun's default), the runs dealt;
- ``launcher``: ``torchrun --nproc-per-node N --no-python true``, torchrun's fixed cost with no
  Python in the ranks (its agent's start, the spawn, its shutdown).

Each command's own time (the result JSON's ``seconds``: from its first run to its table, after the
imports and the group's set-up) is reported beside its wall, and every command's interaction
energies are compared with one process's at the ranks' one thread (``plain 1 thread``: bit for bit
and the largest difference in Eh) and, for information, at ``--threads`` (other BLAS reductions).

    python scripts/bench_interaction_ranks.py --bases cc-pvdz,aug-cc-pvqz --ranks 3 --repeat 2 \\
        --out scripts/results/interaction_ranks
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from dfmp2.benchmarks.timing import cpu_model

ROOT = Path(__file__).resolve().parent.parent
DIMER = ROOT / "inputs" / "s22" / "s22_02_water_dimer.xyz"
FRAGMENTS = "1-3,4-6"
METHODS = ("HF", "MP2", "SCS-MP2")


def _interaction(argv: list[str], env: dict, out: Path, timeout: float) -> dict:
    """Runs one command; its wall (s), the JSON's own ``seconds`` and interaction energies."""
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"error: {' '.join(argv[:6])} ... exited {p.returncode}: {p.stderr.strip()[-300:]}")
    if not out.exists():
        return {"wall": wall}
    d = json.loads(out.read_text())
    out.unlink()
    return {"wall": wall, "seconds": d["seconds"], "energies": d["interaction_energies"]}


def commands(basis: str, ranks: int, threads: int, json_path: Path) -> dict:
    """{label: (argv, environment)} of one round."""
    dfmp2 = ["-m", "dfmp2", "interaction", str(DIMER), "--fragments", FRAGMENTS, "--basis", basis, "-q"]
    dfmp2 += ["--json", str(json_path)]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    one_thread = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}  # torchrun sets 1
    tr = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return {
        "plain": ([sys.executable, *dfmp2], env),
        "plain 1 thread": ([sys.executable, *dfmp2], dict(os.environ, OMP_NUM_THREADS="1")),
        "torchrun 1": ([*tr, "--nproc-per-node", "1", *dfmp2], env),
        f"torchrun {ranks}": ([*tr, "--nproc-per-node", str(ranks), *dfmp2], one_thread),
        "launcher": ([*tr, "--nproc-per-node", str(ranks), "--no-python", "true"], one_thread),
    }


def largest_difference(a: dict, b: dict) -> tuple[float, bool]:
    """The largest |ΔE| (Eh) between two results' interaction energies, and whether all are equal
    bit for bit."""
    worst, same = 0.0, True
    for kind in ("cp", "nocp"):
        for m in METHODS:
            x, y = a[kind][m]["hartree"], b[kind][m]["hartree"]
            worst, same = max(worst, abs(x - y)), same and x == y
    return worst, same


def measure(bases: list[str], ranks: int, threads: int, repeat: int, timeout: float) -> dict:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "r.json"
        for basis in bases:
            runs: dict = {}
            for _ in range(repeat):
                for label, (argv, env) in commands(basis, ranks, threads, out).items():
                    runs.setdefault(label, []).append(_interaction(argv, env, out, timeout))
                    print(f"{basis:12s} {label:12s} {runs[label][-1]['wall']:7.2f} s", file=sys.stderr, flush=True)
            rows.append({"basis": basis, "runs": runs})
    return {"rows": rows}


def summary(row: dict, ranks: int) -> dict:
    runs, many = row["runs"], f"torchrun {ranks}"
    med = {k: statistics.median(r["wall"] for r in v) for k, v in runs.items()}
    own = {k: statistics.median(r["seconds"] for r in v) for k, v in runs.items() if "seconds" in v[0]}
    ref = runs["plain 1 thread"][0]["energies"]  # the ranks' threads: bit for bit (module docstring)
    diffs = [largest_difference(ref, r["energies"]) for r in runs[many]]
    threads = [largest_difference(runs["plain"][0]["energies"], r["energies"]) for r in runs[many]]
    return {
        "wall": med,
        "own": own,
        "ratio_wall": med[many] / med["plain"],
        "ratio_wall_torchrun1": med[many] / med["torchrun 1"],
        "ratio_own": own[many] / own["plain"],
        "ratio_wall_less_launcher": (med[many] - med["launcher"]) / med["plain"],
        "largest_difference_eh": max(d[0] for d in diffs),
        "bitwise": all(d[1] for d in diffs),
        "largest_difference_eh_other_threads": max(d[0] for d in threads),
    }


def markdown(rep: dict) -> str:
    n = rep["ranks"]
    lines = [
        f"# `dfmp2 interaction` over {n} ranks against one process: S22 water dimer",
        "",
        f"{rep['date']}, {rep['machine']}, {rep['cores']} cores; one process {rep['threads']} threads, "
        f"{n} ranks x 1 thread (torchrun's default; {'oversubscribed' if n > rep['cores'] else 'one core each'}). "
        f"Medians of {rep['repeat']} interleaved rounds; wall = the whole command from outside, start-ups "
        "included; own = the result JSON's `seconds` (first run to the table, after imports and group set-up); "
        "launcher = `torchrun --no-python true` with the same ranks.",
        "",
        "| basis | plain wall | own | torchrun 1 wall | own | torchrun N wall | own | launcher | "
        "N / plain (wall) | N / torchrun 1 (wall) | N / plain (own) | (N wall - launcher) / plain "
        "| max abs dE Eh vs 1 thread | bitwise | vs plain's threads |",
        "|---|" + "---:|" * 12 + "---|---:|",
    ]
    for row in rep["rows"]:
        s = row["summary"]
        w, o = s["wall"], s["own"]
        lines.append(
            f"| {row['basis']} | {w['plain']:.2f} | {o['plain']:.2f} | {w['torchrun 1']:.2f} | {o['torchrun 1']:.2f} "
            f"| {w[f'torchrun {n}']:.2f} | {o[f'torchrun {n}']:.2f} | {w['launcher']:.2f} | {s['ratio_wall']:.2f} "
            f"| {s['ratio_wall_torchrun1']:.2f} | {s['ratio_own']:.2f} | {s['ratio_wall_less_launcher']:.2f} "
            f"| {s['largest_difference_eh']:.1e} | {'yes' if s['bitwise'] else 'no'} "
            f"| {s['largest_difference_eh_other_threads']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bases", default="cc-pvdz", help="comma-separated orbital bases [cc-pvdz]")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="threads of the one-process runs [2]")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per command [900]")
    ap.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    a = ap.parse_args(argv)
    if a.ranks < 2 or a.threads < 1 or a.repeat < 1:
        ap.error("--ranks must be at least 2, --threads and --repeat at least 1")
    rep = measure([b.strip() for b in a.bases.split(",") if b.strip()], a.ranks, a.threads, a.repeat, a.timeout)
    rep |= {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": cpu_model(),
        "cores": os.cpu_count(),
        "ranks": a.ranks,
        "threads": a.threads,
        "repeat": a.repeat,
        "openblas_env": {k: v for k, v in os.environ.items() if k.startswith("OPENBLAS_")},
    }
    for row in rep["rows"]:
        row["summary"] = summary(row, a.ranks)
    text = markdown(rep)
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.with_suffix(".json").write_text(json.dumps(rep, indent=1) + "\n")
        a.out.with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
