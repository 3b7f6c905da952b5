#!/usr/bin/env python3
"""Runs over several processes: measured on this machine, and a MODEL for large ones.

MEASURED (this machine, CPU, gloo): ``dfmp2 run`` of (H2O)n/cc-pVDZ as 1 rank x T threads against
T ranks x 1 thread (torchrun), the same blocking; per stage the seconds of each and their ratio;
E_OS/E_SS compared; the communication volume each stage handed to torch.distributed (bytes, all
ranks, from the result JSON) against the model below (``comm_model``).

MODEL (labelled as a model, never a measurement): per-rank time of the MP2 stage for N = 2..64
ranks on two node types, (H2O)64 and (H2O)128 cc-pVDZ, from flop counts and link bandwidths that
are assumptions written at the top of this file (``NODES``): the ring pass overlaps the pair step's
GEMMs (max of the two), the redistribution of (P|ia) does not overlap anything.

    python scripts/bench_distributed.py --waters 8,16 --ranks 2,3,4 --threads 2 --out scripts/results/distributed_2ranks
    python scripts/bench_distributed.py --waters 1 --ranks 2 --threads 2 --occ-block-max 2   # a tiny check
    python scripts/bench_distributed.py --model-only
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "inputs" / "water_clusters"
STAGES = ("scf", "integrals", "metric", "transform", "redistribute", "fit", "pair")

# (H2O)n / cc-pVDZ per water: basis functions, occupied (all-electron), cc-pVDZ-RI and -JKFIT functions
PER_WATER = {"nbasis": 24, "nocc": 5, "naux": 84, "naux_jk": 116}
# Node types of the model: FP64 rate one rank sustains on GEMMs (flop/s), ranks per node, and the
# bandwidth (bytes/s) one rank gets inside a node and between nodes. Assumptions, not measurements:
#   8 x H100 SXM: FP64 tensor-core peak 67 TF/s, ~50 sustained on large GEMMs; NVLink 4 ~450 GB/s
#                 per GPU one way (~300 usable); 400 Gb/s InfiniBand per GPU (50 GB/s, ~40 usable).
#   2-socket CPU: ~1.5 TF/s FP64 per socket (32 cores AVX-512, DGEMM); one rank per socket; between
#                 the sockets through gloo's TCP loopback ~5 GB/s; 100 Gb/s Ethernet per node
#                 (12.5 GB/s, ~10 usable) shared by its 2 ranks.
NODES = {
    "8xH100 NVLink + 400 Gb/s IB": {"flops": 50e12, "per_node": 8, "intra_bw": 300e9, "inter_bw": 40e9, "memory": 80e9},
    "2-socket CPU, 100 Gb/s Ethernet": {
        "flops": 1.5e12,
        "per_node": 2,
        "intra_bw": 5e9,
        "inter_bw": 5e9,
        "memory": 256e9,
    },
}


def shapes_of(waters: int, frozen: bool = False) -> dict:
    s = {k: v * waters for k, v in PER_WATER.items()}
    if frozen:
        s["nocc"] -= waters
    s["nvir"] = s["nbasis"] - s["nocc"] - (waters if frozen else 0)
    return s


def comm_model(
    s: dict,
    ranks: int,
    *,
    occ_block: int,
    scf_cycles: int,
    itemsize: int = 8,
    split_scf: bool = True,
    spins: int = 1,
    pia_rows: list | None = None,
) -> dict:
    """Bytes all ranks hand to torch.distributed per stage (what dfmp2.distributed counts: the
    tensor each rank sends or all-reduces), for closed shells:

        transform  (P|ia) redistribution: each rank's rows (``pia_rows``; default naux/N each) of
                   the other ranks' columns (contiguous occupied blocks, as dfmp2.mp2.dist.owned),
                   about (N-1)/N of (P|ia); plus the per-rank B sizes (N x 8 B each)
        pair       the ring pass: shifts 1..N/2, each rank sends what it holds (one share of B) at
                   every shift but the last: N/2 x B in all (N even: (N/2) x B; odd: (N-1)/2 x B);
                   plus the pair sums, all-reduced: N x npairs x 2 x 8 B
        scf        split SCF: the raw JK factor round the ring, (N-1) x its size; J and K each cycle
                   (cycles + 2 builds: the guess and the final one), N x 2 x nbasis^2 x 8 B; and the
                   orbitals, N x (nbasis x nmo + nmo) x 8 B
    """
    n = ranks
    naux, nocc, nvir, nao = s["naux"], s["nocc"], s["nvir"], s["nbasis"]
    b = naux * nocc * nvir * itemsize
    nblk = -(-nocc // occ_block)
    npairs = nblk * (nblk + 1) // 2
    rows = pia_rows or [naux / n] * n
    cols = [
        sum(min(nocc, (k + 1) * occ_block) - k * occ_block for k in range(r * nblk // n, (r + 1) * nblk // n)) * nvir
        for r in range(n)
    ]
    sent = sum(rows[r] * (nocc * nvir - cols[r]) * 8 for r in range(n))
    out = {"transform": sent + n * n * 8, "pair": (n // 2) * b + n * npairs * 2 * 8}
    factor = s["naux_jk"] * nao * (nao + 1) // 2 * 8
    jk = n * (scf_cycles + 2) * (1 + spins) * nao * nao * 8
    out["scf"] = ((n - 1) * factor + jk + n * (nao * nao + nao) * 8) if split_scf else 0
    return out


def run_one(
    xyz: Path, ranks: int, threads: int, extra: list, workdir: Path, timeout: int, command: str = "run"
) -> dict:
    """One ``dfmp2 <command>`` (run, gradient; torchrun for ranks > 1) at ``threads`` per process;
    its result JSON."""
    out = workdir / f"{xyz.stem}-{command}-{ranks}x{threads}.json"
    cmd = [sys.executable, "-m", "dfmp2", command, str(xyz), "--basis", "cc-pvdz", "--json", str(out), "-q", *extra]
    if ranks > 1:
        cmd[1:3] = ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", "-m", "dfmp2"]
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    )
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(out.read_text())


def _best(results: list) -> dict:
    """The last result with each stage's time and the wall time the least over ``results``."""
    out = dict(results[-1])
    out["timings"] = {k: min(r["timings"].get(k, float("inf")) for r in results) for k in results[-1]["timings"]}
    out["wall_s"] = min(r["wall_s"] for r in results)
    return out


def measured(waters: int, ranks: int, threads: int, extra: list, timeout: int, repeats: int = 2) -> dict:
    xyz = CLUSTERS / f"h2o_{waters:02d}.xyz"
    ones, manys = [], []
    with tempfile.TemporaryDirectory(prefix="dfmp2-bench-dist-") as tmp:
        for _ in range(repeats):  # interleaved; per stage the best of the repeats
            ones.append(run_one(xyz, 1, threads, extra, Path(tmp), timeout))
            manys.append(run_one(xyz, ranks, 1, extra, Path(tmp), timeout))
    one, many = _best(ones), _best(manys)
    d = many["ran"]["distributed"]
    sh = many["shapes"]
    s = {
        "naux": sh["naux"],
        "nocc": sh["nocc"],
        "nvir": sh["nvir"],
        "nbasis": sh["nbasis"],
        "naux_jk": many["memory"]["shapes"].get("naux_jk", 0),
    }
    model = comm_model(
        s,
        ranks,
        occ_block=many["memory"]["occ_block"],
        pia_rows=d["pia_rows_per_rank"],
        scf_cycles=many["ran"]["scf"]["iterations"],
        split_scf=d["scf"] == "split",
    )
    stages = {}
    for st in STAGES:
        a, b = one["timings"].get(st), many["timings"].get(st)
        if a is not None or b is not None:
            stages[st] = {"1rank_s": a, f"{ranks}ranks_s": b, "ratio_1rank_over_nranks": (a / b) if a and b else None}
    comm = {
        st: {
            "measured_bytes": d["comm_bytes_all_ranks"].get(st, 0),
            "model_bytes": round(model[st]),
            "measured_over_model": d["comm_bytes_all_ranks"].get(st, 0) / model[st] if model[st] else None,
            "rank0_seconds": d["comm_rank0"].get(st, {}).get("seconds"),
        }
        for st in model
    }
    e1, en = one["energies"], many["energies"]
    return {
        "waters": waters,
        "ranks": ranks,
        "cores": os.cpu_count(),
        "oversubscribed": ranks > (os.cpu_count() or 1),
        "threads_1rank": threads,
        "threads_per_rank": 1,
        "scf_over_ranks": d["scf"],
        "stages": stages,
        "wall_1rank_s": one["wall_s"],
        f"wall_{ranks}ranks_s": many["wall_s"],
        "comm": comm,
        "B_bytes_per_rank": d["B_bytes_per_rank"],
        "devices": d["devices"],
        "backend": d["backend"],
        "e_os_equal": en["e_corr_os"] == e1["e_corr_os"],
        "e_ss_equal": en["e_corr_ss"] == e1["e_corr_ss"],
        "d_e_hf": en["e_hf"] - e1["e_hf"],
        "d_e_os": en["e_corr_os"] - e1["e_corr_os"],
        "ran_1rank": {k: one["ran"].get(k) for k in ("device", "engine", "threads", "cpu_blas", "pair_path")},
        "ran_nranks": {k: many["ran"].get(k) for k in ("device", "engine", "threads", "cpu_blas", "pair_path")},
    }


def model_row(node: str, waters: int, ranks: int, occ_block: int = 16) -> dict:
    """Per-rank seconds of the MP2 stage's parts on ``ranks`` ranks of ``node`` (a MODEL)."""
    nd, s = NODES[node], shapes_of(waters)
    naux, nocc, nvir, nao = s["naux"], s["nocc"], s["nvir"], s["nbasis"]
    b = naux * nocc * nvir * 8
    pair_flops = naux * nocc * nocc * nvir * nvir  # 2 n_i n_j nvir^2 naux over pairs I >= J
    transform_flops = 2 * naux * nao * nao * nocc + 2 * naux * nao * nocc * nvir + naux * naux * nocc * nvir
    bw = nd["intra_bw"] if ranks <= nd["per_node"] else nd["inter_bw"]
    comm = comm_model(s, ranks, occ_block=occ_block, scf_cycles=0, split_scf=False)
    # the pair step's balance as the code shares it out (dfmp2.mp2.dist.assigned): occupied blocks
    # of occ_block orbitals; a rank that owns no block computes no pair
    from dfmp2 import distributed
    from dfmp2.df.outofcore import OccBlocks
    from dfmp2.mp2 import dist

    blocks = OccBlocks(nocc, nvir, naux, occ_block)
    who = dist.assigned(blocks, ranks)
    load = [0.0] * ranks
    for p, r in who.items():
        load[r] += dist.pair_cost(blocks, *p)
    busiest = max(load) / sum(load)
    share = max(len(dist.owned(blocks.count, distributed.World(rank=r, size=ranks))) for r in range(ranks))
    t_pair = pair_flops * busiest / nd["flops"]
    t_ring = comm["pair"] / ranks / bw  # each rank sends its part, all at once
    t_tr = transform_flops / ranks / nd["flops"]
    t_redis = comm["transform"] / ranks / bw
    per_rank_b = 3 * b * share / blocks.count  # own share, the held and the received
    total = max(t_pair, t_ring) + t_tr + t_redis  # the ring's transfers overlap the pair GEMMs
    one = (pair_flops + transform_flops) / nd["flops"]
    return {
        "node": node,
        "waters": waters,
        "ranks": ranks,
        "occ_block": occ_block,
        "occ_blocks": blocks.count,
        "pair_balance": 1 / (busiest * ranks),
        "B_GB": b / 1e9,
        "B_per_rank_GB": per_rank_b / 1e9,
        "fits": per_rank_b < 0.8 * nd["memory"],
        "pair_s": t_pair,
        "ring_s": t_ring,
        "transform_s": t_tr,
        "redistribute_s": t_redis,
        "total_s": total,
        "speedup_vs_1": one / total,
        "efficiency": one / total / ranks,
    }


def model_table() -> list:
    """Occupied blocks of 16 (the default), and of 4 where 16 leaves ranks without a block."""
    rows = []
    for node in NODES:
        for waters in (64, 128):
            for n in (2, 4, 8, 16, 32, 64):
                for ob in (16, 4):
                    if ob == 16 or -(-PER_WATER["nocc"] * waters // 16) < 2 * n:
                        rows.append(model_row(node, waters, n, occ_block=ob))
    return rows


def markdown(meas: list, rows: list) -> str:
    out = ["# Runs over several processes", ""]
    if meas:
        out += [
            "## Measured on this machine (CPU, gloo)",
            "",
            "Ratio > 1: the N ranks were faster. The energies are bitwise equal only at equal threads per "
            "process (a BLAS sums in another order on another number of threads; here 1 rank has T threads, "
            "each of N ranks 1); tests/system/test_distributed.py checks that at 1 thread per process. More "
            "ranks than cores: "
            "OVERSUBSCRIBED (the ranks share the cores; this measures overheads, not scaling).",
            "",
            "| waters | ranks | cores | oversubscribed | wall 1 rank / s | wall N ranks / s | 1 rank / N ranks |",
            "|---:|---:|---:|---|---:|---:|---:|",
        ]
        for m in meas:
            w1, wn = m["wall_1rank_s"], m[f"wall_{m['ranks']}ranks_s"]
            out.append(
                f"| {m['waters']} | {m['ranks']} | {m.get('cores')} | {'yes' if m.get('oversubscribed') else 'no'} | "
                f"{w1:.2f} | {wn:.2f} | {w1 / wn:.2f} |"
            )
        out.append("")
        for m in meas:
            out += [
                f"(H2O){m['waters']}: 1 rank x {m['threads_1rank']} threads vs {m['ranks']} ranks x 1 thread; "
                f"SCF over ranks: {m['scf_over_ranks']}; E_OS equal bitwise: {m['e_os_equal']}, "
                f"E_SS: {m['e_ss_equal']}, dE(HF) {m['d_e_hf']:.1e} Eh",
                "",
                "| stage | 1 rank / s | N ranks / s | ratio (1 rank / N ranks) |",
                "|---|---:|---:|---:|",
            ]
            for st, v in m["stages"].items():
                a, b, r = v["1rank_s"], v[f"{m['ranks']}ranks_s"], v["ratio_1rank_over_nranks"]
                out.append(
                    f"| {st} | {a if a is None else f'{a:.3f}'} | {b if b is None else f'{b:.3f}'} | "
                    f"{'' if r is None else f'{r:.2f}'} |"
                )
            out += ["", "| communication | measured bytes | model bytes | measured / model |", "|---|---:|---:|---:|"]
            for st, v in m["comm"].items():
                r = v["measured_over_model"]
                out.append(
                    f"| {st} | {v['measured_bytes']:,} | {v['model_bytes']:,} | {'' if r is None else f'{r:.3f}'} |"
                )
            out.append("")
    out += [
        "## MODEL (not a measurement): the MP2 stage per rank, (H2O)n cc-pVDZ",
        "",
        "Assumptions in scripts/bench_distributed.py (NODES); the ring pass overlaps the pair GEMMs "
        "(total = max(pair, ring) + transform + redistribute); the SCF is not modelled. Pair balance: the "
        "busiest rank's share of the pair work as the code deals it (dfmp2.mp2.dist.assigned), 1.00 = even; "
        "smaller occupied blocks (--occ-block-max 4) spread the pairs over more ranks, at a GEMM efficiency "
        "this model does not charge.",
        "",
        "| node | waters | ranks | occ block (blocks) | pair balance | B / GB | B per rank / GB | fits | pair / s | "
        "ring / s | transform / s | redistribute / s | total / s | speed-up | efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        out.append(
            f"| {r['node']} | {r['waters']} | {r['ranks']} | {r['occ_block']} ({r['occ_blocks']}) | "
            f"{r['pair_balance']:.2f} | {r['B_GB']:.1f} | {r['B_per_rank_GB']:.1f} | "
            f"{'yes' if r['fits'] else 'no'} | {r['pair_s']:.2f} | {r['ring_s']:.3f} | {r['transform_s']:.3f} | "
            f"{r['redistribute_s']:.3f} | {r['total_s']:.2f} | {r['speedup_vs_1']:.1f} | {r['efficiency']:.2f} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waters", default="8,16", help="cluster sizes (inputs/water_clusters), e.g. 8,16")
    ap.add_argument(
        "--ranks",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[2],
        help="rank counts, comma list (more ranks than cores: run oversubscribed, labelled so)",
    )
    ap.add_argument("--threads", type=int, default=2, help="threads of the 1-rank run")
    ap.add_argument("--occ-block-max", type=int, default=None)
    ap.add_argument("--scf", choices=("split", "replicated"), default="split", help="dfmp2 run --dist-scf")
    ap.add_argument("--timeout", type=int, default=3600)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each, interleaved; the best per stage")
    ap.add_argument("--model-only", action="store_true")
    ap.add_argument("--out", default=None, help="write OUT.json and OUT.md")
    a = ap.parse_args(argv)
    extra = ["--cpu-blas", "torch", "--dist-scf", a.scf] + (
        ["--occ-block-max", str(a.occ_block_max)] if a.occ_block_max else []
    )
    meas = (
        []
        if a.model_only
        else [measured(int(w), n, a.threads, extra, a.timeout, a.repeats) for w in a.waters.split(",") for n in a.ranks]
    )
    rows = model_table()
    md = markdown(meas, rows)
    print(md)
    if a.out:
        Path(a.out + ".json").write_text(json.dumps({"measured": meas, "model": rows}, indent=1))
        Path(a.out + ".md").write_text(md)


if __name__ == "__main__":
    main()
