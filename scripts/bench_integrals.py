#!/usr/bin/env python
"""Benchmark of the integral engines (dfmp2.df.integrals) inside the DF-MP2 stage after the SCF,
in one process, variants interleaved repeat by repeat:

  today      the path before the engines: libcint in the caller's thread, each block unpacked on
             the host (PySCF's unpack_tril) and the full square copied to the device
  serial     the host engine at depth 0: libcint in the caller's thread, the packed block to the
             device, unpacked there
  thread     the host engine with its producer: one background libcint thread, a ring of packed
             buffers (pinned on CUDA), overlapping the device transform
  host       what `dfmp2 run --integrals host` uses: serial on a host device, thread otherwise
             (``integrals.host_default_depth``)
  gpu4pyscf  gpu4pyscf's CUDA kernels (cuda only)

For each: the stage time, its integrals / transform split (integrals = the time the stage waited
for blocks, plus the metric), the seconds the engine computed (libcint or the GPU kernels), the
energies (float.hex: today, serial, thread and host must agree bit for bit), and the CPU cores other
processes took meanwhile (a shared machine makes the numbers indicative only).

    python scripts/bench_integrals.py                    # CPU, (H2O)16/cc-pVDZ, today/serial/thread
    # the integral engines' GPU acceptance, one command on a CUDA machine with gpu4pyscf (shared/GPU.md):
    python scripts/bench_integrals.py --device cuda --molecules h2o_32,h2o_48 \\
        --variants today,host,gpu4pyscf --gpu4pyscf-dfmp2 --scf gpu4pyscf

--gpu4pyscf-dfmp2 also times gpu4pyscf's own DF-MP2 (gpu4pyscf.mp.dfmp2.DFMP2) on the same SCF and
auxiliary basis; --scf gpu4pyscf runs the DF-RHF reference on the GPU (much faster than PySCF on
the host for (H2O)48; the MP2 stage is the same). On cuda the acceptance targets are checked:
stage <= 1.5 s on (H2O)32 and <= 6 s on (H2O)48, >= 2x gpu4pyscf's DF-MP2, integrals <= 30 %.
Writes scripts/results/integrals_<device>.json and .md (or --out).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

import torch

from dfmp2 import linalg
from dfmp2.benchmarks.timing import OtherCPU, cpu_model, time_mp2_stage
from dfmp2.df import basis, integrals
from dfmp2.io import molecule
from dfmp2.io.result import software_versions
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions
from dfmp2.provenance import ScfRecord
from dfmp2.reference import from_pyscf, restricted
from dfmp2.scf import pyscf_scf

TARGETS = {"h2o_32": 1.5, "h2o_48": 6.0}  # s, the CUDA stage's targets
INTEGRALS_MAX_FRACTION = 0.30
GPU4PYSCF_RATIO_MIN = 2.0


class TodayEngine(integrals.IntegralEngine):
    """The engine before the host engine: libcint in the caller's thread, unpacked on the host, the square copied."""

    name = "host"  # the memory plan's engine (the same host libcint)
    variant = "today"

    def metric(self, auxmol):
        return self.backend.to_device(integrals.metric_2c(auxmol), torch.float64)

    @contextlib.contextmanager
    def blocks(self, auxmol, shell_blocks, dtype=torch.float64):
        def gen():
            it = integrals.iter_j3c(self.mol, auxmol, shell_blocks)
            while True:
                t0 = time.perf_counter()
                item = next(it, None)  # libcint and the host unpack
                self.stats["compute_s"] += time.perf_counter() - t0
                if item is None:
                    return
                p0, p1, full = item
                self.stats["blocks"] += 1
                yield p0, p1, self.backend.to_device(full, dtype)

        yield gen()


@contextlib.contextmanager
def square_passes_through():
    """For 'today': the pipeline's unpack leaves an already full (nb, nao, nao) block as it is."""
    real = integrals.unpack
    integrals.unpack = lambda x, nao: x if x.dim() == 3 else real(x, nao)
    try:
        yield
    finally:
        integrals.unpack = real


def make_engine(variant, mol, backend):
    if variant == "today":
        return TodayEngine(mol, backend, "benchmark: the path before the host engine")
    if variant == "serial":
        return integrals.HostEngine(mol, backend, "benchmark: packed, no thread", depth=0)
    if variant == "thread":
        return integrals.HostEngine(mol, backend, "benchmark: producer thread", depth=integrals.QUEUE_DEPTH)
    return integrals.select_engine(variant, mol, backend)


def reference(mol, how: str, jk_auxbasis):
    """The DF-RHF reference: PySCF on the host (dfmp2's own) or gpu4pyscf on the GPU."""
    if how == "pyscf":
        return pyscf_scf.run_rhf(mol, "df")
    from gpu4pyscf import scf as gscf

    mf = gscf.RHF(mol).density_fit(auxbasis=jk_auxbasis)
    mf.conv_tol = 1e-10
    mf.verbose = 0
    mf.kernel()
    if not mf.converged:
        raise RuntimeError("gpu4pyscf DF-RHF did not converge")
    mf = mf.to_cpu()
    return from_pyscf(
        mf,
        jk_auxbasis=str(jk_auxbasis),
        scf=ScfRecord(
            engine="gpu4pyscf",
            reference="RHF",
            device="cuda",
            source="ran",
            iterations=None,
            jk="gpu4pyscf DF-J/K",
            jk_auxbasis=str(jk_auxbasis),
        ),
    )


def time_gpu4pyscf_dfmp2(ref, auxbasis):
    import cupy
    from gpu4pyscf.mp import dfmp2 as gdfmp2

    torch.cuda.empty_cache()
    cupy.get_default_memory_pool().free_all_blocks()
    pt = gdfmp2.DFMP2(ref.mf.to_gpu(), auxbasis=auxbasis)
    pt.verbose = 0
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    pt.kernel()
    cupy.cuda.Device().synchronize()
    t = time.perf_counter() - t0
    e = float(pt.e_corr)
    del pt
    cupy.get_default_memory_pool().free_all_blocks()
    return t, e


def git_commit() -> str:
    try:
        return (
            subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or "unknown"
        )
    except Exception:
        return "unknown"


def main(argv=None):  # noqa: C901
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--molecules", default="h2o_16", help="comma-separated names in inputs/water_clusters or XYZ paths")
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--variants",
        default=None,
        help="comma-separated: today, serial, thread, host, "
        "gpu4pyscf [default: today,serial,thread on cpu; today,host,gpu4pyscf on cuda]",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scf", choices=("pyscf", "gpu4pyscf"), default="pyscf")
    ap.add_argument("--gpu4pyscf-dfmp2", action="store_true", help="also time gpu4pyscf's DF-MP2 (cuda)")
    ap.add_argument(
        "--scf-cache",
        default=None,
        metavar="DIR",
        help="keep each molecule's SCF orbitals here (npz) and reuse them on the next run "
        "(a shared machine: the (H2O)16 SCF costs minutes of both cores)",
    )
    ap.add_argument("--out", default=None, help="output path without extension")
    args = ap.parse_args(argv)

    backend = linalg.get_backend(args.device)
    caps = backend.caps
    variants = (
        args.variants.split(",")
        if args.variants
        else ["today", "host", "gpu4pyscf"]
        if caps.cuda_memory
        else ["today", "serial", "thread"]
    )
    gpu = torch.cuda.get_device_name(backend.device) if caps.cuda_memory else None
    from pyscf import lib

    meta = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": args.device,
        "gpu": gpu,
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "pyscf_threads": lib.num_threads(),
        "platform": platform.platform(),
        "versions": software_versions(),
        "commit": git_commit(),
        "command": " ".join(sys.argv),
        "variants": variants,
        "repeats": args.repeats,
        "scf": args.scf,
    }
    if caps.cuda_memory:
        meta["versions"]["torch_cuda"] = torch.version.cuda
        try:
            import cupy
            import gpu4pyscf

            meta["versions"].update(cupy=cupy.__version__, gpu4pyscf=gpu4pyscf.__version__)
        except Exception as exc:
            meta["versions"]["gpu4pyscf"] = f"not importable: {exc}"
    print(
        json.dumps({k: meta[k] for k in ("date", "device", "gpu", "cpu", "torch_threads", "pyscf_threads")}), flush=True
    )

    report = {"meta": meta, "molecules": []}
    for name in args.molecules.split(","):
        path = Path(name) if name.endswith(".xyz") else ROOT / "inputs" / "water_clusters" / f"{name}.xyz"
        mol = molecule.build_molecule(read_xyz(path), args.basis)
        auxbasis = basis.mp2_auxbasis(mol)
        auxmol = basis.make_auxmol(mol, auxbasis)
        t0 = time.perf_counter()
        cache = Path(args.scf_cache) / f"{path.stem}_{args.basis}_{args.scf}.npz" if args.scf_cache else None
        if cache is not None and cache.exists():
            import numpy as np

            z = np.load(cache)
            ref = restricted(
                z["mo_coeff"],
                z["mo_energy"],
                int(z["nocc"]),
                e_hf=float(z["e_hf"]),
                source="given",
                scf=ScfRecord(
                    engine="cache",
                    reference="RHF",
                    device="host",
                    source="given",
                    iterations=None,
                    jk=f"read from {cache}",
                ),
            )
            if args.gpu4pyscf_dfmp2:
                raise SystemExit("--gpu4pyscf-dfmp2 needs the SCF object: run without --scf-cache")
        else:
            ref = reference(mol, args.scf, basis.default_auxbasis(mol, "jk"))
            if cache is not None:
                import numpy as np

                cache.parent.mkdir(parents=True, exist_ok=True)
                ch = ref.channels[0]
                np.savez(cache, e_hf=ref.e_hf, mo_coeff=ch.mo_coeff, mo_energy=ch.mo_energy, nocc=ch.nocc)
        t_scf = time.perf_counter() - t0
        print(f"{path.name}: nbasis {mol.nao_nr()}, naux {auxmol.nao_nr()}, SCF ({args.scf}) {t_scf:.1f} s", flush=True)
        opts = RunOptions(basis=args.basis, device=args.device)
        rows = {v: [] for v in variants}
        for v in variants:  # fails before any timing
            make_engine(v, mol, backend)
        for v in variants:  # warm-up
            with square_passes_through() if v == "today" else contextlib.nullcontext():
                time_mp2_stage(mol, auxmol, ref, opts, backend, engine=make_engine(v, mol, backend))
        for rep in range(args.repeats):
            for v in variants:
                eng = make_engine(v, mol, backend)
                m0 = OtherCPU.mark()
                with square_passes_through() if v == "today" else contextlib.nullcontext():
                    t, e_os, e_ss, stages, ran = time_mp2_stage(mol, auxmol, ref, opts, backend, engine=eng)
                other = OtherCPU.cores(m0, OtherCPU.mark())
                d = eng.describe()
                rows[v].append(
                    {
                        "stage_s": t,
                        "stages_s": stages,
                        "engine_compute_s": d["compute_s"],
                        "engine_wait_s": d["wait_s"],
                        "hex": [float.hex(e_os), float.hex(e_ss)],
                        "e_corr": e_os + e_ss,
                        "other_cores": other and other["other_cores"],
                        "ran_integrals": ran["integrals"],
                    }
                )
                print(
                    f"  repeat {rep + 1} {v:9s} stage {t:7.3f} s  integrals {stages.get('integrals', 0):6.3f}  "
                    f"transform {stages.get('transform', 0):6.3f}  engine computed {d['compute_s']:6.3f}  "
                    f"other cores {(other and other['other_cores']) or 0:.2f}",
                    flush=True,
                )
        mrow = {"molecule": path.name, "nbasis": mol.nao_nr(), "naux": auxmol.nao_nr(), "scf_s": t_scf, "variants": {}}
        for v, rs in rows.items():
            med = lambda key: statistics.median(
                r[key] if not isinstance(key, tuple) else r[key[0]].get(key[1], 0.0) for r in rs
            )
            stage = med("stage_s")
            integ = med(("stages_s", "integrals"))
            mrow["variants"][v] = {
                "stage_s": {
                    "median": stage,
                    "min": min(r["stage_s"] for r in rs),
                    "max": max(r["stage_s"] for r in rs),
                },
                "integrals_s": integ,
                "transform_s": med(("stages_s", "transform")),
                "fit_s": med(("stages_s", "fit")),
                "pair_s": med(("stages_s", "pair")),
                "engine_compute_s": med("engine_compute_s"),
                "integrals_fraction": integ / stage,
                "hex": rs[0]["hex"],
                "bits_stable": all(r["hex"] == rs[0]["hex"] for r in rs),
                "e_corr": rs[0]["e_corr"],
                "other_cores_max": max((r["other_cores"] or 0) for r in rs),
                "ran_integrals": rs[-1]["ran_integrals"],
                "runs": rs,
            }
        host_like = [v for v in ("today", "serial", "thread", "host") if v in rows]
        mrow["bits_identical_today_serial_host"] = len({tuple(mrow["variants"][v]["hex"]) for v in host_like}) <= 1
        if args.gpu4pyscf_dfmp2:
            try:
                t, e = time_gpu4pyscf_dfmp2(ref, auxbasis)
                mrow["gpu4pyscf_dfmp2"] = {"s": t, "e_corr": e}
            except Exception as exc:
                mrow["gpu4pyscf_dfmp2"] = {"error": f"{type(exc).__name__}: {exc}"}
        if caps.cuda_memory:
            best = min(mrow["variants"], key=lambda v: mrow["variants"][v]["stage_s"]["median"])
            b = mrow["variants"][best]
            key = path.stem
            mrow["acceptance"] = {
                "best_variant": best,
                "stage_s": b["stage_s"]["median"],
                "target_s": TARGETS.get(key),
                "stage_ok": (b["stage_s"]["median"] <= TARGETS[key]) if key in TARGETS else None,
                "integrals_fraction": b["integrals_fraction"],
                "integrals_ok": b["integrals_fraction"] <= INTEGRALS_MAX_FRACTION,
            }
            g = mrow.get("gpu4pyscf_dfmp2", {})
            if "s" in g:
                mrow["acceptance"]["vs_gpu4pyscf"] = g["s"] / b["stage_s"]["median"]
                mrow["acceptance"]["vs_gpu4pyscf_ok"] = g["s"] / b["stage_s"]["median"] >= GPU4PYSCF_RATIO_MIN
                mrow["acceptance"]["delta_e_corr_vs_gpu4pyscf"] = b["e_corr"] - g["e_corr"]
        report["molecules"].append(mrow)

    tag = args.device.replace(":", "")
    out = Path(args.out) if args.out else ROOT / "scripts" / "results" / f"integrals_{tag}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    md = [
        f"# Integral engines in the DF-MP2 stage ({args.device}{', ' + gpu if gpu else ''})",
        "",
        f"{meta['date']}, {meta['cpu']}, torch threads {meta['torch_threads']}, PySCF threads "
        f"{meta['pyscf_threads']}, commit {meta['commit']}; versions: "
        + ", ".join(
            f"{k} {v}"
            for k, v in meta["versions"].items()
            if k in ("torch", "pyscf", "torch_cuda", "cupy", "gpu4pyscf")
        ),
        "",
        f"Median of {args.repeats} after a warm-up, variants interleaved. integrals = the stage's wait for "
        "blocks + the metric; engine computed = seconds the engine's libcint thread / GPU kernels ran.",
        "",
    ]
    for m in report["molecules"]:
        md += [
            f"## {m['molecule']} (nbasis {m['nbasis']}, naux {m['naux']})",
            "",
            "| variant | stage s (min-max) | integrals s | transform s | fit s | pair s | engine computed s "
            "| integrals % | other processes' cores (max) | E_corr bits |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for v, r in m["variants"].items():
            md.append(
                f"| {v} | {r['stage_s']['median']:.3f} ({r['stage_s']['min']:.3f}-{r['stage_s']['max']:.3f}) "
                f"| {r['integrals_s']:.3f} | {r['transform_s']:.3f} | {r['fit_s']:.3f} | {r['pair_s']:.3f} "
                f"| {r['engine_compute_s']:.3f} | {100 * r['integrals_fraction']:.0f} | {r['other_cores_max']:.2f} "
                f"| {r['hex'][0]} {'stable' if r['bits_stable'] else 'DIFFER'} |"
            )
        md += ["", f"today / serial / host bit-identical: {m['bits_identical_today_serial_host']}"]
        if "gpu4pyscf_dfmp2" in m:
            md.append(f"gpu4pyscf DF-MP2: {json.dumps(m['gpu4pyscf_dfmp2'])}")
        if "acceptance" in m:
            md.append(f"acceptance: {json.dumps(m['acceptance'])}")
        md.append("")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    failed = [
        m["molecule"]
        for m in report["molecules"]
        if not m["bits_identical_today_serial_host"] or any(not r["bits_stable"] for r in m["variants"].values())
    ]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
