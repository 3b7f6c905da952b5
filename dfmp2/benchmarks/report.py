"""Report writers for ``dfmp2 bench``: terminal table (rich), JSON, markdown and a PNG plot.

Measured rows and Trainium estimates are kept in separate tables everywhere; a device that did
not run appears as 'not run' with its reason and never with numbers.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

from .ops import BASELINE_LABELS

SCHEMA = "dfmp2-bench/1"          # the "schema" tag of a report (run.run_bench writes it)
HEADLINE_OPS = ("mp2_pair_energy", "gemm", "trsm")


# ---------- small formatting helpers ----------
def _ms(seconds: float) -> str:
    v = seconds * 1e3
    return f"{v:.0f}" if v >= 100 else f"{v:.3g}"


def ms(t: dict | None) -> str:
    return "—" if not t or "median_s" not in t else _ms(t["median_s"])


def spread(t: dict | None) -> str:
    if not t or "median_s" not in t:
        return "—"
    return f"{_ms(t['min_s'])}–{_ms(t['max_s'])} (n={t['repeats']})"


def gf(t: dict | None) -> str:
    return "—" if not t or t.get("gflops") is None else f"{t['gflops']:.1f}"


def pct(t: dict | None) -> str:
    return "—" if not t or t.get("pct_peak") is None else f"{t['pct_peak']:.0f}%"


def baseline_cell(b) -> str:
    if isinstance(b, dict) and "median_s" in b:
        s = ms(b)
        note = b.get("note", "")
        if "inv_sqrt_eigh row" in note:
            s += " (eigh row)"
        elif b.get("precision") and note:
            s += f" ({b['precision']})"
        return s
    if isinstance(b, dict) and b.get("status") == "not run":
        return "not run"
    return "—"


def ratio(row: dict, name: str = "pyscf") -> str:
    r = row.get(f"{name}_over_this")
    return "—" if r is None else f"{r:.2f}"


def atomic_write(path: Path, text: str) -> None:
    """``text`` to ``path`` by dfmp2.outputs.write_text (atomic over a regular file), making the
    directory first."""
    from ..outputs import write_text
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)


def write_json(report: dict, path: Path) -> None:
    atomic_write(path, json.dumps(report, indent=1, default=str) + "\n")


# ---------- markdown ----------
def _meta_lines(rep: dict) -> list[str]:
    m, v, mach = rep["meta"], rep["meta"]["versions"], rep["meta"]["machine"]
    lines = [f"`{m['command']}` — {m['date']}, wall time {m['wall_s']:.0f} s.", "",
             f"Machine: {mach['cpu']}, {mach['cpu_count']} CPUs (torch threads {mach['torch_threads']}, "
             f"PySCF threads {mach['pyscf_threads']}), host {mach['host']}. " + _load_text(m), "",
             f"Versions: dfmp2 {v['dfmp2']}, torch {v['torch']} ({v['torch_blas']}), numpy {v['numpy']}, "
             f"scipy {v['scipy']} ({v['scipy_blas']}), PySCF {v['pyscf']}, Python {v['python']}.", ""]
    return lines


def _load_text(m: dict) -> str:
    """What else the machine ran during the benchmark: other processes' CPU (measured from
    /proc/stat against this run's own CPU time) where known, else the load average."""
    load = m["load_average_before"][0], m["load_average_after"][0]
    other = m.get("other_cpu")
    if other is not None:
        phases = [x for x in m.get("load_samples", []) if "other_cores" in x]
        worst = max(phases, key=lambda x: x["other_cores"]) if phases else None
        text = (f"Other processes took {other['other_cores']:.2f} CPU cores on average during the run"
                + (f" (most during '{worst['phase']}': {worst['other_cores']:.2f})" if worst else "")
                + f", hypervisor steal {other['steal_cores']:.2f} cores (/proc/stat busy time minus this "
                f"run's own CPU time). Load average (1 min, this run's threads included) before / after: "
                f"{load[0]:.2f} / {load[1]:.2f}")
        if m.get("machine_loaded"):
            return text + (f" — **other work took more than {m.get('other_cores_threshold', 0.25)} cores on "
                           "average: times are pessimistic.**")
        return text + "."
    text = (f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}, highest sampled during "
            f"the run {max([x['load1'] for x in m.get('load_samples', [])] + list(load)):.2f}")
    if m.get("machine_loaded"):
        return text + (f" — **the machine was loaded by other work during this run (1-min load above "
                       f"{m.get('loaded_threshold', 1.5)} on {m['machine']['cpu_count']} CPUs); times are "
                       "pessimistic.**")
    return text + "."


def _devices_lines(rep: dict) -> list[str]:
    lines = ["## Devices", "", "| device | status | engine / reason |", "|---|---|---|"]
    for d in rep["devices"]:
        what = d.get("engine", "") if d["status"] == "ran" else d.get("reason", "")
        lines.append(f"| {d['device']} | {d['status']} | {what} |")
    lines.append("")
    return lines


def _peak_lines(rep: dict) -> list[str]:
    lines = ["## GEMM peak of this run", "",
             "Square GEMM, median, the faster of `torch.matmul` and (CPU) numpy's OpenBLAS (both in the JSON), "
             "measured right before each shape's ops in each precision; every "
             "% of peak below is against the peak measured before its own block (same device, same precision), "
             "so a machine whose load changes during the run is compared with its capacity at the time.", "",
             "| device | precision | measured before | n | library | GFLOP/s | min–max ms |",
             "|---|---|---|---:|---|---:|---|"]
    for p in rep["gemm_peak"]:
        lines.append(f"| {p['device']} | {p['precision']} | {p.get('before', 'the run')} | {p['n']} | "
                     f"{p.get('library', 'torch.matmul')} | {p['gflops']:.1f} | {spread(p)} |")
    lines.append("")
    return lines


def headline_rows(rep: dict) -> list[dict]:
    """Per (shape, device, precision): the pair-energy call and the GEMM/TRSM rates."""
    out = []
    ran = [r for r in rep["ops"] if r["status"] == "ran"]
    keys = []
    for r in ran:
        k = (r["shape"], r["device"], r["precision"])
        if k not in keys:
            keys.append(k)
    for k in keys:
        by_op = {r["op"]: r for r in ran if (r["shape"], r["device"], r["precision"]) == k}
        out.append({"shape": k[0], "device": k[1], "precision": k[2], "ops": by_op})
    return out


def _headline_lines(rep: dict) -> list[str]:
    lines = ["## Headline: per shape", "",
             "The pair-energy call (the DF-MP2 stage's dominant cost, see the ops table for its size) "
             "against PySCF's pair kernel on the same fitted integrals, and the GEMM and TRSM rates. "
             "PySCF / this > 1 means this program is faster.", "",
             "| shape | device | prec | pair ms | pair GFLOP/s | pair % peak | PySCF pair ms | PySCF / this "
             "| gemm GFLOP/s (% peak) | trsm GFLOP/s (% peak) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for h in headline_rows(rep):
        p = h["ops"].get("mp2_pair_energy", {})
        g, t = h["ops"].get("gemm", {}), h["ops"].get("trsm", {})
        lp = p.get("linalg")
        lines.append(
            f"| {h['shape']} | {h['device']} | {h['precision']} | {ms(lp)} | {gf(lp)} | {pct(lp)} | "
            f"{baseline_cell(p.get('pyscf'))} | {ratio(p)} | "
            f"{gf(g.get('linalg'))} ({pct(g.get('linalg'))}) | {gf(t.get('linalg'))} ({pct(t.get('linalg'))}) |")
    lines.append("")
    w = rep.get("waters") or {}
    big = [row for row in w.get("rows", []) if row["nbasis"] >= w.get("fit_min_nbasis", 0)]
    if big:
        lines += ["Whole DF-MP2 stage after the SCF (water clusters, details below):", "",
                  "| cluster | nbasis | run | median s | PySCF s | PySCF / this |", "|---|---:|---|---:|---:|---:|"]
        for row in big:
            py = next((r for r in row["runs"] if r["who"] == "pyscf" and r["status"] == "ran"), None)
            for r in row["runs"]:
                if r["who"] == "dfmp2" and r["status"] == "ran":
                    lines.append(f"| (H2O){row['waters']} | {row['nbasis']} | {r['device']} {r['precision']} | "
                                 f"{r['time']['median_s']:.3g} | {py['time']['median_s']:.3g} | "
                                 f"{r['pyscf_over_this']:.2f} |" if py else
                                 f"| (H2O){row['waters']} | {row['nbasis']} | {r['device']} {r['precision']} | "
                                 f"{r['time']['median_s']:.3g} | not run | — |")
        lines.append("")
    return lines


def _ops_lines(rep: dict) -> list[str]:
    lines = ["## Per-shape ops (measured)", "",
             "Times in ms: median, then min–max over n timed calls (after the warm-up; calls expected to take "
             f"longer than {rep['meta']['single_above_s']:g} s run once without warm-up). GFLOP/s from the op's "
             "flop count; % peak against the GEMM peak of the same device and precision. Baselines on identical "
             "inputs: torch.linalg (the same op through torch directly), scipy.linalg, PySCF (the pair kernel "
             "`libmp.MP2_contract_d`, fp64 only: an fp32 row shows PySCF's fp64 time; in this process, so under the "
             "OPENBLAS variables as set: the water series below takes PySCF from both settings).", "",
             "| shape | op | call | args | device | prec | engine / kernels | median ms | min–max ms | GFLOP/s "
             "| % peak | torch.linalg ms | scipy.linalg ms | PySCF ms | PySCF / this | note |",
             "|---|---|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rep["ops"]:
        if r["status"] != "ran":
            continue
        lr = r["linalg"]
        kern = ", ".join(r.get("kernels", {})) or r.get("engine", "")
        note = r.get("note", "")
        if "iterations" in r:
            note = f"{r['iterations']} iterations, residual {r['residual']:.1e}; " + note
        lines.append(
            f"| {r['shape']} | {r['op']} | {r['call']} | {'x'.join(map(str, r['args']))} | {r['device']} | "
            f"{r['precision']} | {r['engine']}: {kern} | {ms(lr)} | {spread(lr)} | {gf(lr)} | {pct(lr)} | "
            f"{baseline_cell(r.get('torch'))} | {baseline_cell(r.get('scipy'))} | "
            f"{baseline_cell(r.get('pyscf'))} | {ratio(r)} | {note} |")
    notrun = {}
    for r in rep["ops"]:
        if r["status"] == "not run":
            notrun.setdefault((r["device"], r["reason"]), set()).add(r["precision"])
    for (dev, reason), precs in notrun.items():
        lines.append(f"| all | all | — | — | {dev} | {','.join(sorted(precs))} | **not run**: {reason} "
                     "| — | — | — | — | — | — | — | — | |")
    lines.append("")
    return lines


def _estimate_lines(rep: dict) -> list[str]:
    est = rep.get("trn_estimate")
    if not est:
        return []
    meth = est["method"]
    lines = ["## Trainium ESTIMATES (not measured)", "",
             "**These are estimates, not measurements: no Trainium hardware ran.** " + meth["estimate"] + ", from the "
             "instruction stream the trn backend would issue (rebuilt from the NKI kernels' tiling in "
             "`dfmp2/benchmarks/trn_estimate.py`) and AWS's published rates. Excluded: " + meth["excluded"] + ".", "",
             "Rates per NeuronCore: " + "; ".join(est["rate_lines"]) + ".", "",
             "Instruction costs: " + meth["instruction_costs"] + ".", ""]
    if est.get("validation"):
        ok = all(v["match"] for v in est["validation"])
        lines += [("Work model checked against the NKI emulator's own counters (matmul flops, DMA bytes, instruction "
                   "and launch counts) by running the real kernels at shape "
                   f"{est['validation_shape']}: " + ("all equal." if ok else "**MISMATCH** (see JSON).")), ""]
    lines += ["| shape | op | args | device | estimate ms | bound | TensorE ms | VectorE ms | DMA ms | serial ms "
              "| nc_matmul | DMA MB | launches | est. GFLOP/s | % FP32 peak |",
              "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in est["rows"]:
        if r["status"] != "estimate":
            lines.append(f"| {r['shape']} | {r['op']} | {'x'.join(map(str, r['args']))} | {r['device']} | "
                         f"not estimated: {r['reason']} | | | | | | | | | | |")
            continue
        lines.append(
            f"| {r['shape']} | {r['op']} | {'x'.join(map(str, r['args']))} | {r['device']} (estimate) | "
            f"{r['estimate_s'] * 1e3:.3g} | {r['bound']} | {r['tensor_engine_s'] * 1e3:.3g} | "
            f"{r['vector_engine_s'] * 1e3:.3g} | {r['dma_s'] * 1e3:.3g} | {r['serial_s'] * 1e3:.3g} | "
            f"{r['matmul_instructions']} | {r['dma_bytes'] / 1e6:.3g} | {sum(r['launches'].values())} | "
            f"{(r.get('gflops') or 0):.0f} | {(r.get('pct_fp32_peak') or 0):.0f}% |")
    lines += ["", "Sources: " + "; ".join(f"{k}: {v}" for k, v in meth["sources"].items()), ""]
    return lines


def _waters_lines(rep: dict) -> list[str]:
    w = rep.get("waters")
    if not w or not w.get("rows"):
        return []
    lines = ["## Water clusters: the whole DF-MP2 stage after the SCF", "",
             w["what"], "",
             "| waters | nbasis | nocc | nvir | naux | SCF s | run | device / engine | prec | median s | min–max s "
             "| integrals | metric | transform | fit | pair | PySCF / this | ΔE_corr vs PySCF / Eh |",
             "|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in w["rows"]:
        for r in row["runs"]:
            head = (f"| {row['waters']} | {row['nbasis']} | {row['nocc']} | {row['nvir']} | {row['naux']} | "
                    f"{row['scf_s']:.1f} | {r['who']} | ")
            if r["status"] != "ran":
                lines.append(head + f"{r['device']} | {r['precision']} | not run: {r['reason']} "
                             "| | | | | | | | |")
                continue
            t = r["time"]
            st = r.get("stages_s", {})
            cells = " | ".join(f"{st[s]:.3g}" if s in st else "—" for s in ("integrals", "metric", "transform",
                                                                             "fit", "pair"))
            rr = f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r else ("1.00" if r["who"] == "pyscf" else "—")
            de = f"{r['e_corr_minus_pyscf']:.1e}" if "e_corr_minus_pyscf" in r else "—"
            lines.append(head + f"{r['device']} / {r['engine']} | {r['precision']} | {t['median_s']:.3g} | "
                         f"{t['min_s']:.3g}–{t['max_s']:.3g} (n={t['repeats']}) | {cells} | {rr} | {de} |")
    for nr in w.get("not_run", []):
        lines.append(f"| all | | | | | | dfmp2 | {nr['device']} | | **not run**: {nr['reason']} | | | | | | | | |")
    lines += ["", f"### Fitted cost exponents (time ∝ nbasis^p, clusters with nbasis ≥ {w['fit_min_nbasis']})", "",
              "| run | stage | p | ± stderr | R² | points (nbasis) |", "|---|---|---:|---:|---:|---|"]
    for label, entry in w["fits"].items():
        for stage, f in entry.items():
            if stage == "nbasis":
                continue
            if f.get("p") is None:
                lines.append(f"| {label} | {stage} | — | | | {f.get('reason', '')} |")
                continue
            se = f"{f['stderr']:.2f}" if f.get("stderr") is not None else "—"
            lines.append(f"| {label} | {stage} | {f['p']:.2f} | {se} | {f['r2']:.3f} | "
                         f"{', '.join(map(str, entry['nbasis']))} |")
    lines += ["", "Formal cost of the stages: pair O(nocc² nvir² naux) ~ N⁵, transform O(naux nbasis² nocc) ~ N⁴, "
              "fit O(naux² nocc nvir) ~ N⁴, metric O(naux³) ~ N³, integrals ~ N³ before screening.", ""]
    return lines


def markdown(rep: dict) -> str:
    lines = ["# dfmp2 bench", ""] + _meta_lines(rep) + _devices_lines(rep) + _peak_lines(rep)
    lines += _headline_lines(rep) + _ops_lines(rep) + _estimate_lines(rep) + _waters_lines(rep)
    if rep.get("plot"):
        lines += [f"![time vs size]({Path(rep['plot']).name})", ""]
    return "\n".join(lines)


# ---------- terminal ----------
def terminal(rep: dict, console) -> None:
    from rich.markup import escape      # reasons are exception texts, not markup
    from rich.table import Table
    t = Table(title="dfmp2 bench: per-shape ops (measured)", title_justify="left")
    for c in ("shape", "op", "device", "prec", "median ms", "min–max ms", "GFLOP/s", "% peak",
              "torch.linalg ms", "scipy ms", "PySCF ms", "PySCF/this"):
        t.add_column(c, justify="right" if c[0].islower() and "ms" in c or c in ("GFLOP/s", "% peak", "PySCF/this")
                     else "left")
    for r in rep["ops"]:
        if r["status"] != "ran":
            continue
        lr = r["linalg"]
        t.add_row(r["shape"], r["op"], r["device"], r["precision"], ms(lr), spread(lr), gf(lr), pct(lr),
                  baseline_cell(r.get("torch")), baseline_cell(r.get("scipy")), baseline_cell(r.get("pyscf")),
                  ratio(r))
    console.print(t)
    for d in rep["devices"]:
        if d["status"] != "ran":
            console.print(f"[yellow]{escape(d['device'])}: not run[/] — {escape(d['reason'])}")
    est = rep.get("trn_estimate")
    if est and est["rows"]:
        e = Table(title="Trainium ESTIMATES (not measured; no Trainium hardware ran)", title_justify="left")
        for c in ("shape", "op", "device", "estimate ms", "bound", "est. GFLOP/s"):
            e.add_column(c)
        skipped = {}
        for r in est["rows"]:
            if r["status"] == "estimate":
                e.add_row(r["shape"], r["op"], f"{r['device']} (estimate)", f"{r['estimate_s'] * 1e3:.3g}",
                          r["bound"], f"{(r.get('gflops') or 0):.0f}")
            else:
                skipped.setdefault((r["op"], r["reason"]), []).append(f"{r['shape']}/{r['device']}")
        console.print(e)
        for (op, reason), where in skipped.items():
            console.print(f"[dim]not estimated: {op} ({escape(', '.join(where))}): {escape(reason)}[/dim]")
    w = rep.get("waters")
    if w and w.get("rows"):
        s = Table(title="Water clusters: DF-MP2 stage after SCF (s)", title_justify="left")
        for c in ("waters", "nbasis", "run", "prec", "median s", "pair s", "PySCF/this"):
            s.add_column(c)
        for row in w["rows"]:
            for r in row["runs"]:
                if r["status"] != "ran":
                    s.add_row(str(row["waters"]), str(row["nbasis"]), r["who"], r["precision"], "not run", "", "")
                    continue
                s.add_row(str(row["waters"]), str(row["nbasis"]), f"{r['who']} {r['device']}", r["precision"],
                          f"{r['time']['median_s']:.2f}", f"{r.get('stages_s', {}).get('pair', float('nan')):.2f}"
                          if r["who"] == "dfmp2" else "", f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r
                          else "")
        console.print(s)
        f = Table(title=f"cost exponents vs nbasis (nbasis >= {w['fit_min_nbasis']})", title_justify="left")
        for c in ("run", "stage", "p", "R²"):
            f.add_column(c)
        for label, entry in w["fits"].items():
            for stage, fe in entry.items():
                if stage != "nbasis" and fe.get("p") is not None:
                    f.add_row(label, stage, f"{fe['p']:.2f}", f"{fe['r2']:.3f}")
        console.print(f)


# ---------- plot ----------
def plot(rep: dict, path: Path) -> bool:
    """Time vs size, log-log: left, per-op calls vs nbasis of the shape for each device/precision
    (Trainium estimates dashed, hollow, labelled 'estimate'); right, the water-cluster stage vs
    nbasis with the fitted power laws. Returns False (and writes nothing) without matplotlib.
    Written by dfmp2.outputs.write_bytes: a half-written plot never appears under ``path``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    has_w = bool(rep.get("waters") and rep["waters"].get("rows"))
    fig, axes = plt.subplots(1, 2 if has_w else 1, figsize=(13 if has_w else 7, 5.2), squeeze=False)
    ax = axes[0][0]
    dims = {s["name"]: s["nbasis"] for s in rep["shapes"]}
    markers = {"mp2_pair_energy": "o", "gemm": "s", "trsm": "^", "inv_sqrt_eigh": "v",
               "inv_sqrt_newton_schulz": "D", "cholesky": "x", "syrk": "+"}
    series: dict = {}
    for r in rep["ops"]:
        if r["status"] == "ran" and r["op"] in ("mp2_pair_energy", "gemm", "trsm"):
            series.setdefault((r["op"], f"{r['device']} {r['precision']}", False), []).append(
                (dims[r["shape"]], r["linalg"]["median_s"]))
            if r["precision"] == "fp64" and isinstance(r.get("pyscf"), dict) and "median_s" in r["pyscf"]:
                series.setdefault((r["op"], "PySCF cpu fp64", False), []).append(
                    (dims[r["shape"]], r["pyscf"]["median_s"]))
    for r in (rep.get("trn_estimate") or {}).get("rows", []):
        if r["status"] == "estimate" and r["op"] in ("mp2_pair_energy", "gemm", "trsm"):
            series.setdefault((r["op"], f"{r['device']} fp32 ESTIMATE", True), []).append(
                (dims[r["shape"]], r["estimate_s"]))
    colors: dict = {}
    for (op, who, is_est), pts in sorted(series.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pts = sorted(set(pts))
        xs, ys = zip(*pts)
        color = colors.setdefault(who, f"C{len(colors) % 10}")
        ax.plot(xs, ys, linestyle="--" if is_est else "-", marker=markers.get(op, "o"), color=color,
                fillstyle="none" if is_est else "full", label=f"{who}: {op}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    from matplotlib.ticker import NullFormatter
    ticks = sorted({(v, k) for k, v in dims.items()})
    ax.set_xticks([v for v, _ in ticks])
    ax.set_xticklabels([f"{k}\n{v}" for v, k in ticks], fontsize=7)
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("shape (nbasis)")
    ax.set_ylabel("time per call / s")
    ax.set_title("per-op calls at DF-MP2 shapes (dashed: Trainium estimates, not measured)", fontsize=9)
    ax.legend(fontsize=6.5, ncol=1)
    ax.grid(True, which="both", alpha=0.3)
    if has_w:
        ax2 = axes[0][1]
        w = rep["waters"]
        groups: dict = {}
        for row in w["rows"]:
            for r in row["runs"]:
                if r["status"] == "ran":
                    label = f"{r['who']} {r['device']} {r['precision']}" if r["who"] == "dfmp2" else "pyscf cpu fp64"
                    groups.setdefault(label, []).append((row["nbasis"], r["time"]["median_s"]))
        for label, pts in groups.items():
            xs, ys = zip(*sorted(pts))
            f = w["fits"].get(label, {}).get("total", {})
            lab = label + (f" (p = {f['p']:.2f})" if f.get("p") is not None else "")
            line, = ax2.plot(xs, ys, marker="o", label=lab)
            if f.get("p") is not None:
                nb = w["fits"][label]["nbasis"]
                xf = [min(nb), max(nb)]
                ax2.plot(xf, [f["c"] * x ** f["p"] for x in xf], linestyle=":", color=line.get_color())
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        nbs = sorted({row["nbasis"] for row in w["rows"]})
        ax2.set_xticks(nbs)
        ax2.set_xticklabels([f"{row['waters']}\n{row['nbasis']}" for row in sorted(w["rows"], key=lambda r: r["nbasis"])],
                            fontsize=7)
        ax2.xaxis.set_minor_formatter(NullFormatter())
        ax2.set_xlabel("waters n / nbasis ((H2O)n, cc-pVDZ: 24 n)")
        ax2.set_ylabel("DF-MP2 stage after SCF / s")
        ax2.set_title("water clusters (dotted: fitted power law)", fontsize=9)
        ax2.legend(fontsize=7)
        ax2.grid(True, which="both", alpha=0.3)
    m = rep["meta"]
    fig.suptitle(f"dfmp2 bench {m['date']} — {m['machine']['cpu']}, {m['machine']['torch_threads']} threads"
                 + (" (machine loaded)" if m.get("machine_loaded") else ""), fontsize=9)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    from ..outputs import write_bytes
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, buf.getvalue())       # atomic, with the umask's mode, as the JSON and markdown
    return True


__all__ = ["markdown", "terminal", "plot", "write_json", "atomic_write", "headline_rows", "BASELINE_LABELS"]
