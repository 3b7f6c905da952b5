#!/usr/bin/env python
"""Benchmark: how time and memory grow with the molecule, at one fixed memory limit.

For each water cluster (H2O)n (inputs/water_clusters, ``--sizes``) in each basis (``--basis``), the
whole ``dfmp2 run --memory LIMIT`` in its own process (wall time, the process's peak resident
memory from os.wait4, the JK factor's layout and where B went), then (unless ``--no-pyscf``)
PySCF's DF-RHF + DF-MP2 with ``max_memory`` = LIMIT in each BLAS setting
(dfmp2.benchmarks.fair_baseline.SETTINGS: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE as set, unset, and
OPENBLAS_CORETYPE=Haswell and =SkylakeX where the CPU runs them, each in its own process; the
fastest counts; where neither variable is set as_set and unset are the same and
PySCF runs once; PySCF's limit counts its arrays, not the process). Then a growth exponent per
column: time ~ nbasis^p, least squares on the logs (dfmp2.benchmarks.waters.fit_exponent).
``--merge`` adds the sizes run to the rows already in the output JSON (a size run again replaces
its row), so one long table can be measured a few sizes at a time.

    python scripts/bench_scaling.py --sizes 8 16 24 --memory 2GB
    python scripts/bench_scaling.py --sizes 8 16 --basis cc-pvtz --memory 8GB --no-pyscf
    python scripts/bench_scaling.py --sizes 32 --memory 2GB --merge

Writes scripts/results/scaling_<basis>.json and .md (``--out`` a path stem elsewhere).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

from dfmp2.benchmarks import fair_baseline as fb
from dfmp2.benchmarks.timing import cpu_model, now, run_dfmp2
from dfmp2.benchmarks.waters import fit_exponent
from dfmp2.cli.options import parse_memory
from dfmp2.io.result import software_versions


def run_ours(xyz: Path, basis: str, memory: str, threads: int, timeout: float) -> dict:
    """One ``dfmp2 run`` in its own process (``timing.run_dfmp2``): wall s, peak RSS MB, and from
    its JSON the energies (Eh), the SCF's JK factor layout and share of pairs kept, where B went."""
    run = run_dfmp2(xyz, ["--basis", basis, "--memory", memory], threads, timeout)
    if "error" in run:
        return {k: v for k, v in run.items() if k != "result"}
    d = run["result"]
    return {
        "wall_s": run["wall_s"],
        "max_rss_mb": run["max_rss_mb"],
        "nbasis": d["shapes"]["nbasis"] if "shapes" in d else None,
        "e_hf": d["energies"]["e_hf"],
        "e_corr": d["energies"]["e_corr"],
        "scf_layout": d["ran"]["scf"]["jk_factor"]["layout"],
        "jk_pairs_kept": _kept(d["ran"]["scf"]["jk_factor"].get("screening")),
        "b_storage": (d["ran"].get("storage") or {}).get("B"),
        "timings": d["timings"],
        "warnings": d.get("warnings", []),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[8, 12, 16, 24])
    ap.add_argument("--basis", default="cc-pvdz")
    ap.add_argument("--memory", default="2GB", help="the fixed limit, ours (--memory) and PySCF's max_memory")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=7200)
    ap.add_argument("--no-pyscf", action="store_true")
    ap.add_argument("--out", help="path stem of the .json and .md (default scripts/results/scaling_<basis>)")
    ap.add_argument("--merge", action="store_true", help="keep the other sizes' rows of the output JSON")
    a = ap.parse_args(argv)
    limit_mb = parse_memory(a.memory)
    rows = _earlier_rows(a, limit_mb) if a.merge else []
    for n in a.sizes:
        xyz = ROOT / "inputs" / "water_clusters" / f"h2o_{n:02d}.xyz"
        if not xyz.exists():
            print(f"error: no {xyz} (inputs/make_water_clusters.py writes the sizes it knows)", file=sys.stderr)
            return 2
        row = {"n": n, "date": now(), "ours": run_ours(xyz, a.basis, a.memory, a.threads, a.timeout)}
        print(f"(H2O){n} ours: {row['ours']}", file=sys.stderr)
        if not a.no_pyscf:
            base = fb.pyscf_baseline(
                ["whole"],
                xyz,
                basis=a.basis,
                threads=a.threads,
                timeout=a.timeout,
                max_memory=limit_mb,
                peak_sizes=[],
                once_when_same=True,
            )
            best = base["runs"].get(base["best"]) if base["best"] else None
            row["pyscf"] = {
                "best": base["best"],
                "runs": {
                    s: {k: r.get(k) for k in ("error", "max_rss_mb")} | (r.get("tasks") or {}).get("whole", {})
                    for s, r in base["runs"].items()
                },
                "wall_s": best["tasks"]["whole"]["seconds"] if best else None,
                "max_rss_mb": best.get("max_rss_mb") if best else None,
            }
            print(f"(H2O){n} PySCF: {row['pyscf']}", file=sys.stderr)
        rows = sorted([r for r in rows if r["n"] != n] + [row], key=lambda r: r["n"])
        doc = write(a, limit_mb, rows)  # after every size: a run stopped early keeps the sizes done
    print("\n".join(markdown(doc)))
    return 0


def _stem(a) -> Path:
    return Path(a.out) if a.out else ROOT / "scripts" / "results" / f"scaling_{a.basis}"


def _earlier_rows(a, limit_mb: float) -> list:
    """The rows of the output JSON, each marked with the date it was measured (``--merge``); a file
    measured at another memory limit or basis is refused (its rows would not be comparable)."""
    path = _stem(a).with_suffix(".json")
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    if doc["memory_limit_mb"] != limit_mb or doc["basis"] != a.basis:
        sys.exit(
            f"error: {path} was measured at {doc['memory_limit_mb']:.0f} MB / {doc['basis']}; --merge needs the same"
        )
    return [r | {"date": r.get("date", doc["date"])} for r in doc["rows"]]


def write(a, limit_mb: float, rows: list) -> dict:
    """The document of the sizes done (with each column's growth exponent), written to the .json
    and .md of ``a.out`` (default scripts/results/scaling_<basis>)."""
    nb = [r["ours"].get("nbasis") for r in rows]
    exps = {"ours_wall": fit_exponent(nb, [r["ours"].get("wall_s") for r in rows])}
    exps["ours_rss"] = fit_exponent(nb, [r["ours"].get("max_rss_mb") for r in rows])
    if not a.no_pyscf:
        exps["pyscf_wall"] = fit_exponent(nb, [(r.get("pyscf") or {}).get("wall_s") for r in rows])
        exps["pyscf_rss"] = fit_exponent(nb, [(r.get("pyscf") or {}).get("max_rss_mb") for r in rows])
    doc = {
        "date": now(),
        "machine": {"cpu": cpu_model(), "platform": platform.platform(), "threads": a.threads},
        "blas": fb.blas_info(),
        "versions": software_versions(),
        "basis": a.basis,
        "memory_limit_mb": limit_mb,
        "rows": rows,
        "exponents": exps,
        "rule": "each run in its own process; RSS = the process's peak resident set (os.wait4 / getrusage); "
        "PySCF in each BLAS setting, the fastest counts (as_set and unset run once where neither variable is set); "
        "a row's ours and PySCF come from the same invocation (its date)",
    }
    stem = _stem(a)
    stem.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    stem.with_suffix(".md").write_text("\n".join(markdown(doc)) + "\n")
    return doc


def markdown(doc: dict) -> list[str]:
    lim = doc["memory_limit_mb"]
    lines = [
        f"# Scaling at a fixed memory limit: (H2O)n / {doc['basis']}, --memory {lim:.0f} MB",
        "",
        f"{doc['date']}, {doc['machine']['cpu']}, {doc['machine']['threads']} threads. "
        f"{fb.blas_summary(doc['blas'])}. {doc['rule']}.",
        "",
        "| n | nbasis | ours s | ours RSS MB | SCF factor | B | PySCF s | PySCF RSS MB | PySCF / ours | |ΔE(MP2)| Eh "
        "| measured |",
        "|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|",
    ]
    for r in doc["rows"]:
        o, p = r["ours"], r.get("pyscf") or {}
        if "error" in o:
            lines.append(f"| {r['n']} | | {o['error']} | | | | | | | | {r.get('date', '')[:16]} |")
            continue
        pb = (p.get("runs") or {}).get(p.get("best")) or {}
        if p and not p.get("best"):  # every setting failed: say why in the time column
            p = {"wall_s": None, "error": "; ".join(sorted({r.get("error") or "?" for r in p["runs"].values()}))}
        de = abs(o["e_hf"] + o["e_corr"] - pb["e_mp2"]) if pb.get("e_mp2") is not None else None
        kept = f", {100 * o['jk_pairs_kept']:.0f} % of pairs" if o.get("jk_pairs_kept") else ""
        lines.append(
            f"| {r['n']} | {o['nbasis']} | {o['wall_s']:.1f} | {o['max_rss_mb']:.0f} | {o['scf_layout']}{kept} | "
            f"{o['b_storage']} | {p.get('error') or _f(p.get('wall_s'), '.1f')} | {_f(p.get('max_rss_mb'), '.0f')} | "
            f"{_f(p['wall_s'] / o['wall_s'] if p.get('wall_s') else None, '.2f')} | {_f(de, '.1e')} | "
            f"{r.get('date', doc['date'])[:16]} |"
        )
    lines += ["", "Growth exponents (time or RSS ~ nbasis^p, least squares on the logs):", ""]
    for k, e in doc["exponents"].items():
        lines.append(f"- {k}: " + (f"p = {e['p']:.2f} ({e['points']} points)" if e.get("p") is not None else "n/a"))
    return lines


def _kept(screening: dict | None) -> float | None:
    """The share of the JK factor's pairs the screening kept (None: a run before screening)."""
    return screening["pairs_kept"] / screening["pairs_total"] if screening else None


def _f(x, spec: str) -> str:
    return "" if x is None else format(x, spec)


if __name__ == "__main__":
    sys.exit(main())
