#!/usr/bin/env python3
"""The gradient over ranks on this machine: ``dfmp2 gradient`` of one molecule as
1 rank x 2 threads, 2 ranks x 1 thread (torchrun) and 1 rank x 1 thread, interleaved, ``--repeats``
times; per run the wall time of the whole command, the energy run's and the gradient stage's
seconds and the gradient stage's parts (seconds, from the JSON); and whether 2 x 1 equals 1 x 1 bit
for bit (equal threads per process). On a 2-core machine 2 x 1 against 1 x 2 measures overheads
(the ranks share the cores the one process's BLAS uses); 2 x 1 against 1 x 1 is the split's gain.

    python scripts/bench_gradient_ranks.py --xyz inputs/water_clusters/h2o_08.xyz --repeats 2 \\
        --out scripts/results/gradient_ranks_h2o08.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from bench_distributed import run_one

TIMEOUT_S = 3600
CONFIGS = ((1, 2), (2, 1), (1, 1))  # (ranks, threads per rank)


def one(xyz: str, ranks: int, threads: int, workdir: Path) -> dict:
    t0 = time.perf_counter()
    d = run_one(Path(xyz), ranks, threads, ["--cpu-blas", "torch"], workdir, TIMEOUT_S, command="gradient")
    wall = time.perf_counter() - t0
    g = d["gradient"]
    return {
        "config": f"{ranks}x{threads}",
        "wall_s": wall,
        "energy_wall_s": d["wall_s"],
        "gradient_stage_s": g["wall_s"],
        "stages": g.get("timings"),
        "grad": g["gradient"],
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--xyz", default=str(ROOT / "inputs" / "water_clusters" / "h2o_08.xyz"))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the rows as JSON here")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="dfmp2-bench-grad-ranks-") as tmp:
        for _rep in range(a.repeats):
            for ranks, threads in CONFIGS:
                r = one(a.xyz, ranks, threads, Path(tmp))
                rows.append(r)
                parts = {k: round(v, 2) for k, v in (r["stages"] or {}).items()}
                print(
                    r["config"],
                    f"{r['wall_s']:.2f}",
                    f"{r['energy_wall_s']:.2f}",
                    f"{r['gradient_stage_s']:.2f}",
                    parts,
                )
    g = {r["config"]: r["grad"] for r in rows}
    print("2x1 == 1x1 bitwise:", g["2x1"] == g["1x1"])
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
