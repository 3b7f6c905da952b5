"""The split DF-SCF's time per cycle and fit on 1 and N gloo ranks.

    python scripts/bench_split_scf.py [--tree PATH] [--ranks 2] [--repeat 2] [mol.xyz]
    python scripts/bench_split_scf.py --modes split,replicated [--ranks 2] [mol.xyz]

Runs ``dfmp2 run`` (default options: --dist-scf split, --cpu-blas torch, OMP_NUM_THREADS=1 per
process) from the checkout ``--tree`` (default this one) on one process and under torchrun with
``--ranks`` processes, ``--repeat`` times each, and prints per run: SCF cycles, seconds per cycle
(ran.scf.times.scf / iterations: the cycles with the one-electron set-up and the guess), the
fit's seconds (scf_fit), E(HF), E_OS, E_SS (as float.hex: equal bits print equal). On a machine
with fewer cores than ranks the ranks are oversubscribed: say so beside the numbers.
``--modes split,replicated``: the N-rank runs of each --dist-scf mode instead, interleaved repeat by
repeat (does 'replicated' still pay?), with each run's wall time (the result's wall_s).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(tree: Path, ranks: int, xyz: Path, basis: str, out: Path, mode: str = "split") -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "dfmp2", "run", str(xyz), "--basis", basis, "--cpu-blas", "torch", "-q"]
    cmd += ["--json", str(out), "--dist-scf", mode]
    if ranks > 1:
        cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dfmp2"]
    subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, cwd=out.parent)
    res = json.loads(out.read_text())
    scf = res["ran"]["scf"]
    e = res["energies"]
    return {
        "cycles": scf["iterations"],
        "per_cycle_s": scf["times"]["scf"] / scf["iterations"],
        "fit_s": scf["times"].get("scf_fit", 0.0),
        "wall_s": res["wall_s"],
        "e_hf": float(e["e_hf"]).hex(),
        "e_os": float(e["e_corr_os"]).hex(),
        "e_ss": float(e["e_corr_ss"]).hex(),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("xyz", nargs="?", default=str(ROOT / "inputs/water_clusters/h2o_08.xyz"))
    ap.add_argument("--tree", default=str(ROOT))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--modes", default=None, help="e.g. split,replicated: the N-rank runs of each, interleaved")
    a = ap.parse_args()
    a.xyz = str(Path(a.xyz).resolve())  # the runs start in a temporary directory
    if a.modes:
        modes = a.modes.split(",")
        with tempfile.TemporaryDirectory() as tmp:
            rows = {m: [] for m in modes}
            for i in range(a.repeat):
                for m in modes:
                    rows[m].append(run(Path(a.tree), a.ranks, Path(a.xyz), a.basis, Path(tmp) / f"{m}-{i}.json", m))
            for m in modes:
                walls, per = [r["wall_s"] for r in rows[m]], [r["per_cycle_s"] for r in rows[m]]
                print(
                    f"{a.ranks} ranks, --dist-scf {m}: wall {', '.join(f'{w:.2f}' for w in walls)} s (median "
                    f"{statistics.median(walls):.2f}), s/cycle median {statistics.median(per):.3f}, cycles "
                    f"{rows[m][0]['cycles']}; E(HF) {rows[m][0]['e_hf']} E_OS {rows[m][0]['e_os']} E_SS {rows[m][0]['e_ss']}",
                    flush=True,
                )
        return
    with tempfile.TemporaryDirectory() as tmp:
        for ranks in (1, a.ranks):
            rows = [
                run(Path(a.tree), ranks, Path(a.xyz), a.basis, Path(tmp) / f"r{ranks}-{i}.json")
                for i in range(a.repeat)
            ]
            per = [r["per_cycle_s"] for r in rows]
            fit = [r["fit_s"] for r in rows]
            print(
                f"ranks {ranks}: cycles {rows[0]['cycles']}, s/cycle median {statistics.median(per):.3f} "
                f"(min {min(per):.3f}, max {max(per):.3f}), fit median {statistics.median(fit):.3f} s "
                f"(min {min(fit):.3f}, max {max(fit):.3f}); E(HF) {rows[0]['e_hf']} E_OS {rows[0]['e_os']} "
                f"E_SS {rows[0]['e_ss']}; equal over repeats: {len({(r['e_hf'], r['e_os'], r['e_ss']) for r in rows}) == 1}",
                flush=True,
            )


if __name__ == "__main__":
    main()
