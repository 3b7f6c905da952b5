#!/usr/bin/env python
"""Benchmark: the DF-MP2 pair step with B in memory against B out of core (HDF5 on disk, read by
occupied block on a prefetch thread), on the same B, with a bitwise check of the block sums.

    python scripts/bench_outofcore.py                       # (H2O)40 / cc-pVDZ, frozen core: B 3.3 GB
    python scripts/bench_outofcore.py --waters 4 --out /tmp/smoke   # seconds

What it does, in one process:
  1. the molecule ((H2O)n from inputs/make_water_clusters.py, or --xyz) and its orbitals;
  2. builds B out of core with the pipeline's own build_B (integrals, transforms, column-blocked
     fit) into an HDF5 file under --scratch, and times those stages;
  3. measures the disk: one sequential read of the whole file after dropping it from the page cache;
  4. pair step in memory: all blocks loaded into RAM first (load time reported apart), then
     outofcore.pair_block_sums;
  5. pair step out of core, cold: the file dropped from the page cache before the run and each
     block dropped again after it is read (posix_fadvise DONTNEED), so every read comes from the
     disk as it would for a B larger than RAM (on this machine RAM could cache the whole file);
     optionally (--warm) also with the page cache left alone;
  6. checks the per-pair sums of 4 and 5 are bitwise identical and reports time / ratio, the
     time the pair loop waited for reads, the pair step's GFLOP/s against a DGEMM/SGEMM measured in
     the same run.

Orbitals (--orbitals): 'core' (default) takes the eigenvectors of the core Hamiltonian (h C = S C e)
as C and a fixed spread of orbital energies (occupied -1.5..-0.5 Eh, virtual 0.2..3 Eh): the pair
step's cost depends only on the shapes, and a DF-SCF on (H2O)40 (18 GB of JK-fit 3-index
integrals) would dominate the run. The energies are therefore NOT MP2 energies of the molecule.
'scf' runs the real RHF (slow for large n).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "inputs"))

from dfmp2 import linalg
from dfmp2.benchmarks.timing import cpu_model
from dfmp2.df import basis, outofcore
from dfmp2.drivers.plan import largest_shell
from dfmp2.io import molecule
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.memory import plan_memory
from dfmp2.mp2.stage import build_B
from dfmp2.provenance import ScfRecord
from dfmp2.reference import restricted
from dfmp2.scf import pyscf_scf
from dfmp2.timing import Timer

GB = 1e9


def drop_cache(path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd) if os.access(path, os.W_OK) else None
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def gemm_peak(dtype, n=2048, repeats=3) -> dict:
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    a @ b
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        ts.append(time.perf_counter() - t0)
    return {
        "n": n,
        "gflops": 2 * n**3 / statistics.median(ts) / GB,
        "median_s": statistics.median(ts),
        "min_s": min(ts),
        "max_s": max(ts),
    }


def core_orbitals(mol, nocc):
    """Core-Hamiltonian eigenvectors (orthonormal in S) and a fixed, well-separated spread of orbital
    energies (so no denominator is near zero); see the module docstring."""
    import scipy.linalg

    h = mol.intor("int1e_kin") + mol.intor("int1e_nuc")
    s = mol.intor("int1e_ovlp")
    _, c = scipy.linalg.eigh(h, s)
    nmo = c.shape[1]
    e = np.concatenate([np.linspace(-1.5, -0.5, nocc), np.linspace(0.2, 3.0, nmo - nocc)])
    return restricted(
        c,
        e,
        nocc,
        e_hf=float("nan"),
        source="given",
        scf=ScfRecord(
            engine="core-guess",
            reference="RHF",
            device="host",
            source="given",
            iterations=None,
            jk="none (core-Hamiltonian orbitals)",
        ),
    )


class TimedStore:
    """Wraps a store so the pair loop's waits for the next block are timed."""

    def __init__(self, store):
        self.store, self.blocks, self.wait_s = store, store.blocks, 0.0

    def iter_blocks(self, order, backend):
        it = self.store.iter_blocks(order, backend)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    item = next(it)
                except StopIteration:
                    return
                self.wait_s += time.perf_counter() - t0
                yield item
        finally:
            it.close()


LABELS = {
    "memory": "B in memory",
    "disk": "B on disk, every read from the disk (page cache dropped)",
    "warm": "B on disk, page cache warm",
}


def pair_step(store, eps_occ, eps_vir, backend):
    """(sums, record): wall s, s waited for blocks, main-thread CPU s (the compute: torch runs in the
    main thread with --threads 1), and the 1-minute load average sampled after every block pair."""
    ts = TimedStore(store)
    loads = []
    c0, t0 = time.thread_time(), time.perf_counter()
    sums = outofcore.pair_block_sums(
        ts, eps_occ, eps_vir, backend, progress=lambda d, n: loads.append(os.getloadavg()[0])
    )
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return sums, {
        "pair_s": wall,
        "wait_for_reads_s": ts.wait_s,
        "main_thread_cpu_s": cpu,
        "load_mean": statistics.mean(loads),
        "load_max": max(loads),
    }


def summarise(rec) -> None:
    """Out-of-core runs against the in-memory runs: ratio to their mean (and to the slowest and
    fastest), and the same for the main thread's CPU time."""
    mem = [r for r in rec["runs"] if r["kind"] == "memory"]
    if not mem:
        return
    t_mem = statistics.mean(r["pair_s"] for r in mem)
    c_mem = statistics.mean(r["main_thread_cpu_s"] for r in mem)
    rec["in_memory_mean_s"] = t_mem
    for r in rec["runs"]:
        r["ratio_vs_memory_mean"] = r["pair_s"] / t_mem
        r["ratio_vs_memory_range"] = [
            r["pair_s"] / max(x["pair_s"] for x in mem),
            r["pair_s"] / min(x["pair_s"] for x in mem),
        ]
        r["cpu_ratio_vs_memory_mean"] = r["main_thread_cpu_s"] / c_mem


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--waters", type=int, default=40, help="(H2O)n cluster from inputs/make_water_clusters.py")
    ap.add_argument("--xyz", default=None, help="a molecule instead of --waters")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--all-electron", action="store_true", help="default: frozen core")
    ap.add_argument("--precision", choices=["fp64", "fp32"], default="fp64")
    ap.add_argument("--orbitals", choices=["core", "scf"], default="core")
    ap.add_argument("--threads", type=int, default=None, help="torch threads [default: torch's]")
    ap.add_argument("--occ-block", type=int, default=None, help="default: the memory plan's")
    ap.add_argument("--scratch", default=None, help="where B's HDF5 file goes [default: temp dir]")
    ap.add_argument(
        "--runs",
        default="memory,disk,memory",
        help="pair steps in order: memory, disk (cold reads), warm (page cache left alone); "
        "the default brackets the out-of-core run by two in-memory runs, so a change in "
        "the machine's load during the benchmark shows up",
    )
    ap.add_argument("--previous", nargs="*", default=[], help="earlier result JSON files to keep in the output")
    ap.add_argument(
        "--out",
        default=str(ROOT / "scripts/results/outofcore_cpu"),
        help="output path without suffix (.json and .md are written)",
    )
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    backend = linalg.get_backend("cpu")
    dtype = linalg.DTYPES[args.precision]
    load_before = os.getloadavg()

    if args.xyz:
        geom = read_xyz(args.xyz)
        label = Path(args.xyz).name
    else:
        from make_water_clusters import xyz_text

        with tempfile.TemporaryDirectory(prefix="dfmp2-bench-") as tmp:
            (Path(tmp) / f"h2o_{args.waters:02d}.xyz").write_text(xyz_text(args.waters))
            geom = read_xyz(Path(tmp) / f"h2o_{args.waters:02d}.xyz")
        label = f"(H2O){args.waters}"
    mol = molecule.build_molecule(geom, args.basis)
    auxbasis = basis.mp2_auxbasis(mol)
    auxmol = basis.make_auxmol(mol, auxbasis)
    nfrozen = 0 if args.all_electron else molecule.frozen_core_count(mol)
    nocc_all = mol.nelectron // 2
    t0 = time.perf_counter()
    ref = core_orbitals(mol, nocc_all) if args.orbitals == "core" else pyscf_scf.run_rhf(mol, "df")
    t_orb = time.perf_counter() - t0
    nocc, nvir, naux, nao = nocc_all - nfrozen, ref.nmo - nocc_all, auxmol.nao_nr(), mol.nao_nr()
    plan = plan_memory(
        nao=nao,
        nocc=nocc,
        nvir=nvir,
        naux=naux,
        itemsize=dtype.itemsize,
        limit_mb=None,
        storage="disk",
        aux_shell_max=largest_shell(auxmol),
        occ_block=args.occ_block,
    )
    blocks = outofcore.OccBlocks(nocc, nvir, naux, plan.occ_block)
    b_bytes = blocks.size * dtype.itemsize
    npairs = len(blocks.pairs())
    flops = nocc * (nocc + 1) // 2 * 2 * nvir * nvir * naux
    print(
        f"{label} {args.basis}: nbasis {nao}, nocc {nocc} (+{nfrozen} frozen), nvir {nvir}, naux {naux}; "
        f"B {b_bytes / GB:.2f} GB ({b_bytes / 2**30:.2f} GiB) {args.precision}; occ block {plan.occ_block}, "
        f"{blocks.count} blocks, {npairs} block pairs; {flops / 1e12:.1f} TFLOP in the pair step",
        flush=True,
    )

    peaks = {"fp64": gemm_peak(torch.float64), "fp32": gemm_peak(torch.float32)}
    print(f"GEMM peak: fp64 {peaks['fp64']['gflops']:.1f}, fp32 {peaks['fp32']['gflops']:.1f} GFLOP/s", flush=True)
    C, mo_energy = ref.channels[0].mo_coeff, ref.channels[0].mo_energy
    eps_occ = torch.as_tensor(mo_energy[nfrozen:nocc_all], dtype=torch.float64)
    eps_vir = torch.as_tensor(mo_energy[nocc_all:], dtype=torch.float64)
    rec = {}
    outofcore.Scratch(args.scratch).check_space(b_bytes * 1.6 / 1e6)
    B_disk = outofcore.open_b_store(plan, blocks, dtype, backend, scratch=args.scratch)
    try:
        timer = Timer(backend)
        t0 = time.perf_counter()
        build_B(mol, auxmol, C[:, nfrozen:nocc_all], C[:, nocc_all:], backend, torch.float64, plan, timer, B_disk)
        rec["build_B_s"] = time.perf_counter() - t0
        rec["build_B_stages_s"] = dict(timer.seconds)
        path = B_disk.path
        rec["b_file"] = {"path": path, "bytes": os.path.getsize(path)}
        print(f"B built out of core in {rec['build_B_s']:.1f} s {rec['build_B_stages_s']}; file {path}", flush=True)

        drop_cache(path)
        t0 = time.perf_counter()
        for k in range(blocks.count):
            B_disk.read_block(k)
        t = time.perf_counter() - t0
        rec["disk_read_cold"] = {"s": t, "GB_per_s": b_bytes / t / GB}
        print(f"cold sequential read of B: {t:.1f} s, {b_bytes / t / GB:.2f} GB/s", flush=True)

        # warm-up: one small pair-kernel call (first-call costs are not the pair step's)
        b0 = outofcore.pair_view(B_disk.read_block(0), nvir)[:1]
        linalg.mp2_pair_energy(b0, b0, eps_occ[:1], eps_occ[:1], eps_vir, symmetric=True, backend=backend)
        del b0
        t0 = time.perf_counter()
        mem = outofcore.InMemoryB(blocks, dtype, "cpu", allocate=False)
        for k in range(blocks.count):
            mem.set_block(k, B_disk.read_block(k))
        rec["load_into_memory_s"] = time.perf_counter() - t0
        reads = sum(1 for i, j in blocks.pairs() if i != j) + blocks.count
        read_bytes = (
            int(sum(np.prod(blocks.shape(j)) for i, j in blocks.pairs() if i != j) + blocks.size) * dtype.itemsize
        )
        rec["runs"] = []
        sums_mem = None
        for name in args.runs.split(","):
            if name == "memory":
                store = mem
            else:
                if name == "disk":
                    drop_cache(path)
                B_disk.evict = name == "disk"
                store = B_disk
            sums, x = pair_step(store, eps_occ, eps_vir, backend)
            x.update(kind=name, gflops=flops / x["pair_s"] / GB)
            if name != "memory":
                x.update(block_reads=reads, bytes_read=read_bytes)
            if sums_mem is None:
                sums_mem = sums
            x["bitwise_equal_to_first"] = sums.tobytes() == sums_mem.tobytes()
            rec["runs"].append(x)
            print(
                f"pair step, {LABELS[name]}: {x['pair_s']:.1f} s ({x['gflops']:.1f} GFLOP/s), main-thread CPU "
                f"{x['main_thread_cpu_s']:.1f} s, waited {x['wait_for_reads_s']:.2f} s for blocks, mean load "
                f"{x['load_mean']:.2f}; bitwise equal to the first run: {x['bitwise_equal_to_first']}",
                flush=True,
            )
        mem.close()
        del mem
    finally:
        B_disk.close()
    summarise(rec)
    e_os, e_ss = outofcore.combine(sums_mem, blocks.pairs())
    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix()] + (argv if argv is not None else sys.argv[1:])),
        "machine": {
            "cpu": cpu_model(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "mem_total_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB,
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "versions": software_versions(),
        "backend": backend.describe(),
    }
    import h5py

    meta["versions"]["h5py"], meta["versions"]["hdf5"] = h5py.__version__, h5py.version.hdf5_version
    result = {
        "meta": meta,
        "problem": {
            "molecule": label,
            "basis": args.basis,
            "auxbasis": basis.describe_auxbasis(auxbasis),
            "frozen_core": not args.all_electron,
            "precision": args.precision,
            "nbasis": nao,
            "nocc": nocc,
            "nfrozen": nfrozen,
            "nvir": nvir,
            "naux": naux,
            "orbitals": args.orbitals,
            "orbitals_s": t_orb,
            "metric": B_disk.metric[0],
            "b_bytes": b_bytes,
            "b_gib": b_bytes / 2**30,
            "occ_block": plan.occ_block,
            "occ_blocks": blocks.count,
            "block_pairs": npairs,
            "pair_flops": flops,
            "e_os_e_ss_not_mp2_energies" if args.orbitals == "core" else "e_os_e_ss": [e_os, e_ss],
        },
        "plan": plan.to_dict(),
        "gemm_peak": peaks,
        **rec,
    }
    if args.previous:
        result["previous_runs"] = [json.loads(Path(f).read_text()) for f in args.previous]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    out.with_suffix(".md").write_text(render(result) + "\n")
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0 if all(r["bitwise_equal_to_first"] for r in result["runs"]) else 1


def render(r) -> str:
    p, m = r["problem"], r["meta"]
    peak = r["gemm_peak"][p["precision"]]["gflops"]
    lines = [
        "# Out-of-core pair step vs in-memory",
        "",
        f"`{m['command']}` on {m['date']}: {m['machine']['cpu']}, {m['machine']['cpu_count']} CPUs, "
        f"{m['machine']['mem_total_gb']:.0f} GB RAM, torch {m['versions']['torch']} "
        f"({m['machine']['torch_threads']} threads), h5py {m['versions']['h5py']} / HDF5 {m['versions']['hdf5']}. "
        f"Load average before/after: {m['machine']['load_average_before'][0]:.1f} / "
        f"{m['machine']['load_average_after'][0]:.1f} (a machine shared with other work).",
        "",
        f"Problem: {p['molecule']} / {p['basis']} / {p['auxbasis']}, "
        f"{'frozen core' if p['frozen_core'] else 'all electrons'}, {p['precision']}: nbasis {p['nbasis']}, "
        f"nocc {p['nocc']}, nvir {p['nvir']}, naux {p['naux']}. **B = {p['b_bytes'] / 1e9:.2f} GB "
        f"({p['b_gib']:.2f} GiB)**, {p['occ_blocks']} occupied blocks of {p['occ_block']}, "
        f"{p['block_pairs']} block pairs, {p['pair_flops'] / 1e12:.1f} TFLOP in the pair step.",
        "",
        f"Orbitals: {p['orbitals']}"
        + (
            " (core-Hamiltonian eigenvectors with a fixed spread of orbital "
            "energies: the timings are those of the real shapes, the energies are not "
            "the molecule's MP2 energy)"
            if p["orbitals"] == "core"
            else " (RHF)"
        )
        + ".",
        "",
        f"B was built out of core in {r['build_B_s']:.1f} s; its file is {r['b_file']['bytes'] / 1e9:.2f} GB. "
        f"Cold sequential read of the whole file: {r['disk_read_cold']['GB_per_s']:.2f} GB/s.",
        "",
        f"In-memory pair steps: B loaded into RAM first ({r['load_into_memory_s']:.1f} s, not counted). "
        f"Out of core: {next((x['block_reads'] for x in r['runs'] if 'block_reads' in x), 0)} block reads, "
        f"{next((x['bytes_read'] for x in r['runs'] if 'bytes_read' in x), 0) / 1e9:.1f} GB, on a prefetch thread. "
        "Runs in the order listed; × = wall time / mean of the in-memory runs (range: against the slowest and "
        "the fastest of them); CPU = the main thread's CPU time (the compute, 1 torch thread), which the "
        "machine's other load inflates far less than the wall time.",
        "",
        "| # | pair step | wall / s | × in-memory (range) | GFLOP/s | % of GEMM peak | waited for blocks / s "
        "| main-thread CPU / s | CPU × in-memory | load avg 1-min mean (max) | bitwise = run 1 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n, x in enumerate(r["runs"], 1):
        lo, hi = x["ratio_vs_memory_range"]
        lines.append(
            f"| {n} | {LABELS[x['kind']]} | {x['pair_s']:.1f} | {x['ratio_vs_memory_mean']:.3f} "
            f"({lo:.3f}–{hi:.3f}) | {x['gflops']:.1f} | {100 * x['gflops'] / peak:.0f} "
            f"| {x['wait_for_reads_s']:.2f} | {x['main_thread_cpu_s']:.1f} | {x['cpu_ratio_vs_memory_mean']:.3f} "
            f"| {x['load_mean']:.2f} ({x['load_max']:.2f}) | {'yes' if x['bitwise_equal_to_first'] else 'NO'} |"
        )
    lines += [
        "",
        f"GEMM peak in the same run ({p['precision']}, n={r['gemm_peak'][p['precision']]['n']}): {peak:.1f} GFLOP/s.",
    ]
    for prev in r.get("previous_runs", []):
        pm = prev["meta"]
        lines += [
            "",
            f"Earlier run, `{pm['command']}` on {pm['date']} (load average before/after "
            f"{pm['machine']['load_average_before'][0]:.1f} / {pm['machine']['load_average_after'][0]:.1f}):",
        ]
        if "runs" in prev:
            for x in prev["runs"]:
                lines.append(
                    f"- {LABELS[x['kind']]}: {x['pair_s']:.1f} s, × {x['ratio_vs_memory_mean']:.3f}, "
                    f"waited {x['wait_for_reads_s']:.2f} s for blocks"
                )
        else:  # the first version of this script: one run each
            lines.append(f"- B in memory: {prev['in_memory']['pair_s']:.1f} s")
            c = prev["out_of_core_cold"]
            lines.append(
                f"- B on disk, cold: {c['pair_s']:.1f} s, × {c['ratio_vs_memory']:.3f}, waited "
                f"{c['wait_for_reads_s']:.2f} s for blocks, bitwise equal: "
                f"{'yes' if c['bitwise_equal_to_memory'] else 'NO'}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
