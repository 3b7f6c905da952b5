"""Report writers for ``dfmp2 bench``: terminal table (rich), JSON, markdown, and (from
dfmp2.benchmarks.plot) the PNG plot.

Measured rows and Trainium estimates are kept in separate tables everywhere; a device that did
not run appears as 'not run' with its reason and never with numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

from dfmp2.benchmarks.ops import BASELINE_LABELS
from dfmp2.benchmarks.plot import panel_titles, plot, plot_series, series_colors  # the PNG, one face

SCHEMA = "dfmp2-bench/1"  # the "schema" tag of a report (run.run_bench writes it)
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
    """``text`` to ``path`` by dfmp2.io.outputs.write_text (atomic over a regular file), making the
    directory first."""
    from dfmp2.io.outputs import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, text)


def write_json(report: dict, path: Path) -> None:
    atomic_write(path, json.dumps(report, indent=1, default=str) + "\n")


# ---------- markdown ----------
def _meta_lines(rep: dict) -> list[str]:
    m, v, mach = rep["meta"], rep["meta"]["versions"], rep["meta"]["machine"]
    lines = [
        f"`{m['command']}` — {m['date']}, wall time {m['wall_s']:.0f} s.",
        "",
        f"Machine: {mach['cpu']}, {mach['cpu_count']} CPUs (torch threads {mach['torch_threads']}, "
        f"PySCF threads {mach['pyscf_threads']}), host {mach['host']}. " + _load_text(m),
        "",
        f"Versions: dfmp2 {v['dfmp2']}, torch {v['torch']} ({v['torch_blas']}), numpy {v['numpy']}, "
        f"scipy {v['scipy']} ({v['scipy_blas']}), PySCF {v['pyscf']}, Python {v['python']}.",
        "",
    ]
    return lines


def _load_text(m: dict) -> str:
    """What else the machine ran during the benchmark: other processes' CPU (measured from
    /proc/stat against this run's own CPU time) where known, else the load average."""
    load = m["load_average_before"][0], m["load_average_after"][0]
    other = m.get("other_cpu")
    if other is not None:
        phases = [x for x in m.get("load_samples", []) if "other_cores" in x]
        worst = max(phases, key=lambda x: x["other_cores"]) if phases else None
        text = (
            f"Other processes took {other['other_cores']:.2f} CPU cores on average during the run"
            + (f" (most during '{worst['phase']}': {worst['other_cores']:.2f})" if worst else "")
            + f", hypervisor steal {other['steal_cores']:.2f} cores (/proc/stat busy time minus this "
            f"run's own CPU time). Load average (1 min, this run's threads included) before / after: "
            f"{load[0]:.2f} / {load[1]:.2f}"
        )
        if m.get("machine_loaded"):
            return text + (
                f" — **other work took more than {m.get('other_cores_threshold', 0.25)} cores on "
                "average: times are pessimistic.**"
            )
        return text + "."
    text = (
        f"Load average (1 min) before / after: {load[0]:.2f} / {load[1]:.2f}, highest sampled during "
        f"the run {max([x['load1'] for x in m.get('load_samples', [])] + list(load)):.2f}"
    )
    if m.get("machine_loaded"):
        return text + (
            f" — **the machine was loaded by other work during this run (1-min load above "
            f"{m.get('loaded_threshold', 1.5)} on {m['machine']['cpu_count']} CPUs); times are "
            "pessimistic.**"
        )
    return text + "."


def _devices_lines(rep: dict) -> list[str]:
    lines = ["## Devices", "", "| device | status | engine / reason |", "|---|---|---|"]
    for d in rep["devices"]:
        what = d.get("engine", "") if d["status"] == "ran" else d.get("reason", "")
        lines.append(f"| {d['device']} | {d['status']} | {what} |")
    lines.append("")
    return lines


def _peak_lines(rep: dict) -> list[str]:
    lines = [
        "## GEMM peak of this run",
        "",
        "Square GEMM, median, the faster of `torch.matmul` and (CPU) numpy's OpenBLAS (both in the JSON), "
        "measured right before each shape's ops in each precision; every "
        "% of peak below is against the peak measured before its own block (same device, same precision), "
        "so a machine whose load changes during the run is compared with its capacity at the time.",
        "",
        "| device | precision | measured before | n | library | GFLOP/s | min–max ms |",
        "|---|---|---|---:|---|---:|---|",
    ]
    for p in rep["gemm_peak"]:
        lines.append(
            f"| {p['device']} | {p['precision']} | {p.get('before', 'the run')} | {p['n']} | "
            f"{p.get('library', 'torch.matmul')} | {p['gflops']:.1f} | {spread(p)} |"
        )
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
    lines = [
        "## Headline: per shape",
        "",
        "The pair-energy call (the DF-MP2 stage's dominant cost, see the ops table for its size) "
        "against PySCF's pair kernel on the same fitted integrals, and the GEMM and TRSM rates. "
        "PySCF / this > 1 means this program is faster.",
        "",
        "| shape | device | prec | pair ms | pair GFLOP/s | pair % peak | PySCF pair ms | PySCF / this "
        "| gemm GFLOP/s (% peak) | trsm GFLOP/s (% peak) |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for h in headline_rows(rep):
        p = h["ops"].get("mp2_pair_energy", {})
        g, t = h["ops"].get("gemm", {}), h["ops"].get("trsm", {})
        lp = p.get("linalg")
        lines.append(
            f"| {h['shape']} | {h['device']} | {h['precision']} | {ms(lp)} | {gf(lp)} | {pct(lp)} | "
            f"{baseline_cell(p.get('pyscf'))} | {ratio(p)} | "
            f"{gf(g.get('linalg'))} ({pct(g.get('linalg'))}) | {gf(t.get('linalg'))} ({pct(t.get('linalg'))}) |"
        )
    lines.append("")
    w = rep.get("waters") or {}
    big = [row for row in w.get("rows", []) if row["nbasis"] >= w.get("fit_min_nbasis", 0)]
    if big:
        lines += [
            "Whole DF-MP2 stage after the SCF (water clusters, details below):",
            "",
            "| cluster | nbasis | run | median s | PySCF s | PySCF / this |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for row in big:
            py = next((r for r in row["runs"] if r["who"] == "pyscf" and r["status"] == "ran"), None)
            for r in row["runs"]:
                if r["who"] == "dfmp2" and r["status"] == "ran":
                    lines.append(
                        f"| (H2O){row['waters']} | {row['nbasis']} | {r['device']} {r['precision']} | "
                        f"{r['time']['median_s']:.3g} | {py['time']['median_s']:.3g} | "
                        f"{r['pyscf_over_this']:.2f} |"
                        if py
                        else f"| (H2O){row['waters']} | {row['nbasis']} | {r['device']} {r['precision']} | "
                        f"{r['time']['median_s']:.3g} | not run | — |"
                    )
        lines.append("")
    return lines


def _ops_lines(rep: dict) -> list[str]:
    lines = [
        "## Per-shape ops (measured)",
        "",
        "Times in ms: median, then min–max over n timed calls (after the warm-up; calls expected to take "
        f"longer than {rep['meta']['single_above_s']:g} s run once without warm-up). GFLOP/s from the op's "
        "flop count; % peak against the GEMM peak of the same device and precision. Baselines on identical "
        "inputs: torch.linalg (the same op through torch directly), scipy.linalg, PySCF (the pair kernel "
        "`libmp.MP2_contract_d`, fp64 only: an fp32 row shows PySCF's fp64 time; in this process, so under the "
        "OPENBLAS variables as set: the water series below takes PySCF from every setting).",
        "",
        "| shape | op | call | args | device | prec | engine / kernels | median ms | min–max ms | GFLOP/s "
        "| % peak | torch.linalg ms | scipy.linalg ms | PySCF ms | PySCF / this | note |",
        "|---|---|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
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
            f"{baseline_cell(r.get('pyscf'))} | {ratio(r)} | {note} |"
        )
    notrun = {}
    for r in rep["ops"]:
        if r["status"] == "not run":
            notrun.setdefault((r["device"], r["reason"]), set()).add(r["precision"])
    for (dev, reason), precs in notrun.items():
        lines.append(
            f"| all | all | — | — | {dev} | {','.join(sorted(precs))} | **not run**: {reason} "
            "| — | — | — | — | — | — | — | — | |"
        )
    lines.append("")
    return lines


def _estimate_lines(rep: dict) -> list[str]:
    est = rep.get("trn_estimate")
    if not est:
        return []
    meth = est["method"]
    lines = [
        "## Trainium ESTIMATES (not measured)",
        "",
        "**These are estimates, not measurements: no Trainium hardware ran.** " + meth["estimate"] + ", from the "
        "instruction stream the trn backend would issue (rebuilt from the NKI kernels' tiling in "
        "`dfmp2/benchmarks/trn_estimate.py`) and AWS's published rates. Excluded: " + meth["excluded"] + ".",
        "",
        "Rates per NeuronCore: " + "; ".join(est["rate_lines"]) + ".",
        "",
        "Instruction costs: " + meth["instruction_costs"] + ".",
        "",
    ]
    if est.get("validation"):
        ok = all(v["match"] for v in est["validation"])
        lines += [
            (
                "Work model checked against the NKI emulator's own counters (matmul flops, DMA bytes, instruction "
                "and launch counts) by running the real kernels at shape "
                f"{est['validation_shape']}: " + ("all equal." if ok else "**MISMATCH** (see JSON).")
            ),
            "",
        ]
    lines += [
        "| shape | op | args | device | estimate ms | bound | TensorE ms | VectorE ms | DMA ms | serial ms "
        "| nc_matmul | DMA MB | launches | est. GFLOP/s | % FP32 peak |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in est["rows"]:
        if r["status"] != "estimate":
            lines.append(
                f"| {r['shape']} | {r['op']} | {'x'.join(map(str, r['args']))} | {r['device']} | "
                f"not estimated: {r['reason']} | | | | | | | | | | |"
            )
            continue
        lines.append(
            f"| {r['shape']} | {r['op']} | {'x'.join(map(str, r['args']))} | {r['device']} (estimate) | "
            f"{r['estimate_s'] * 1e3:.3g} | {r['bound']} | {r['tensor_engine_s'] * 1e3:.3g} | "
            f"{r['vector_engine_s'] * 1e3:.3g} | {r['dma_s'] * 1e3:.3g} | {r['serial_s'] * 1e3:.3g} | "
            f"{r['matmul_instructions']} | {r['dma_bytes'] / 1e6:.3g} | {sum(r['launches'].values())} | "
            f"{(r.get('gflops') or 0):.0f} | {(r.get('pct_fp32_peak') or 0):.0f}% |"
        )
    lines += ["", "Sources: " + "; ".join(f"{k}: {v}" for k, v in meth["sources"].items()), ""]
    return lines


def _waters_lines(rep: dict) -> list[str]:
    w = rep.get("waters")
    if not w or not w.get("rows"):
        return []
    lines = [
        "## Water clusters: the whole DF-MP2 stage after the SCF",
        "",
        w["what"],
        "",
        "| waters | nbasis | nocc | nvir | naux | SCF s | run | device / engine | prec | median s | min–max s "
        "| integrals | metric | transform | fit | pair | PySCF / this | ΔE_corr vs PySCF / Eh |",
        "|---:|---:|---:|---:|---:|---:|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in w["rows"]:
        for r in row["runs"]:
            head = (
                f"| {row['waters']} | {row['nbasis']} | {row['nocc']} | {row['nvir']} | {row['naux']} | "
                f"{row['scf_s']:.1f} | {r['who']} | "
            )
            if r["status"] != "ran":
                lines.append(head + f"{r['device']} | {r['precision']} | not run: {r['reason']} | | | | | | | | |")
                continue
            t = r["time"]
            st = r.get("stages_s", {})
            cells = " | ".join(
                f"{st[s]:.3g}" if s in st else "—" for s in ("integrals", "metric", "transform", "fit", "pair")
            )
            rr = f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r else ("1.00" if r["who"] == "pyscf" else "—")
            de = f"{r['e_corr_minus_pyscf']:.1e}" if "e_corr_minus_pyscf" in r else "—"
            lines.append(
                head + f"{r['device']} / {r['engine']} | {r['precision']} | {t['median_s']:.3g} | "
                f"{t['min_s']:.3g}–{t['max_s']:.3g} (n={t['repeats']}) | {cells} | {rr} | {de} |"
            )
    for nr in w.get("not_run", []):
        lines.append(f"| all | | | | | | dfmp2 | {nr['device']} | | **not run**: {nr['reason']} | | | | | | | | |")
    lines += [
        "",
        f"### Fitted cost exponents (time ∝ nbasis^p, clusters with nbasis ≥ {w['fit_min_nbasis']})",
        "",
        "| run | stage | p | ± stderr | R² | points (nbasis) |",
        "|---|---|---:|---:|---:|---|",
    ]
    for label, entry in w["fits"].items():
        for stage, f in entry.items():
            if stage == "nbasis":
                continue
            if f.get("p") is None:
                lines.append(f"| {label} | {stage} | — | | | {f.get('reason', '')} |")
                continue
            se = f"{f['stderr']:.2f}" if f.get("stderr") is not None else "—"
            lines.append(
                f"| {label} | {stage} | {f['p']:.2f} | {se} | {f['r2']:.3f} | {', '.join(map(str, entry['nbasis']))} |"
            )
    lines += [
        "",
        "Formal cost of the stages: pair O(nocc² nvir² naux) ~ N⁵, transform O(naux nbasis² nocc) ~ N⁴, "
        "fit O(naux² nocc nvir) ~ N⁴, metric O(naux³) ~ N³, integrals ~ N³ before screening.",
        "",
    ]
    return lines


def _radicals_lines(rep: dict) -> list[str]:
    """The open-shell series (``dfmp2 bench --radicals``), one line per run."""
    rd = rep.get("radicals")
    if not rd or not rd.get("rows"):
        return []
    lines = [
        "## Open shells: the DF-UMP2 stage after the SCF",
        "",
        rd["what"],
        "",
        "| molecule | mult. | nbasis | nocc α/β | naux | UHF s (cycles; ours) | run | device / engine | prec "
        "| median s | pair | PySCF / this | ΔE_corr vs PySCF / Eh |",
        "|---|---:|---:|---|---:|---|---|---|---|---:|---:|---:|---:|",
    ]
    for row in rd["rows"]:
        head = (
            f"| {row['radical']} | {row['multiplicity']} | {row['nbasis']} | {row['nocc'][0]}/{row['nocc'][1]} | "
            f"{row['naux']} | {row['scf_s']:.1f} ({row['scf_cycles']}; {row['our_dfuhf_cycles']}) | "
        )
        for r in row["runs"]:
            if r["status"] != "ran":
                lines.append(head + f"{r['who']} | {r['device']} | {r['precision']} | not run: {r['reason']} | | | |")
                continue
            pair = f"{r['stages_s']['pair']:.3g}" if "stages_s" in r else "—"
            rr = f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r else ("1.00" if r["who"] == "pyscf" else "—")
            de = f"{r['e_corr_minus_pyscf']:.1e}" if "e_corr_minus_pyscf" in r else "—"
            lines.append(
                head + f"{r['who']} | {r['device']} / {r['engine']} | {r['precision']} | "
                f"{r['time']['median_s']:.3g} | {pair} | {rr} | {de} |"
            )
    return lines + [""]


def markdown(rep: dict) -> str:
    lines = ["# dfmp2 bench", ""] + _meta_lines(rep) + _devices_lines(rep) + _peak_lines(rep)
    lines += _headline_lines(rep) + _ops_lines(rep) + _estimate_lines(rep) + _waters_lines(rep)
    lines += _radicals_lines(rep)
    if rep.get("plot"):
        lines += [f"![time vs size]({Path(rep['plot']).name})", ""]
    return "\n".join(lines)


# ---------- terminal ----------
# The terminal tables fit 80 columns (rich cuts a cell that does not fit to '…'): the op names and
# engine bounds are abbreviated, with a legend under the table that used them, and the measured
# ops are two tables (this program's times and rates; the baselines on the same inputs).
OP_SHORT = {
    "mp2_pair_energy": "pair",
    "mp2_pair_energy_os": "pair-os",
    "inv_sqrt_eigh": "isqrt-eigh",
    "inv_sqrt_newton_schulz": "isqrt-NS",
    "cholesky": "chol",
}
BOUND_SHORT = {"tensor_engine": "TensorE", "vector_engine": "VectorE", "dma": "DMA", "serial": "serial"}
TERMINAL_WIDTH = 80


def _table(title: str, columns, right=()):
    """A compact rich table: no vertical rules, one space of padding, headers over a rule."""
    from rich import box
    from rich.table import Table

    t = Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 1),
        collapse_padding=True,
        show_edge=False,
    )
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", no_wrap=True)
    return t


def _op(op: str, used: set) -> str:
    if op in OP_SHORT:
        used.add(op)
    return OP_SHORT.get(op, op)


def _legend(console, used: set, extra=()) -> None:
    parts = [f"{OP_SHORT[o]} = {o}" for o in sorted(used)] + list(extra)
    if parts:
        console.print("[dim]" + "; ".join(parts) + "[/dim]", highlight=False)


def _baseline_short(b) -> tuple[str, str]:
    """A baseline cell without its note, and the note's mark ('†' the inv_sqrt_eigh row's time,
    '‡' another precision's) or ''."""
    if isinstance(b, dict) and "median_s" in b:
        note = b.get("note", "")
        mark = "†" if "inv_sqrt_eigh row" in note else ("‡" if b.get("precision") and note else "")
        return ms(b) + mark, mark
    if isinstance(b, dict) and b.get("status") == "not run":
        return "n/r", "n/r"
    return "—", ""


def _measured_tables(rep: dict, console) -> None:
    ran = [r for r in rep["ops"] if r["status"] == "ran"]
    if not ran:
        return
    used, marks = set(), set()
    t = _table(
        "dfmp2 bench: per-shape ops (measured), ms",
        ("shape", "op", "device", "prec", "median", "min–max", "n", "GFLOP/s", "% peak"),
        right=("median", "min–max", "n", "GFLOP/s", "% peak"),
    )
    for r in ran:
        lr = r["linalg"]
        t.add_row(
            r["shape"],
            _op(r["op"], used),
            r["device"],
            r["precision"],
            ms(lr),
            f"{_ms(lr['min_s'])}–{_ms(lr['max_s'])}",
            str(lr["repeats"]),
            gf(lr),
            pct(lr),
        )
    console.print(t)
    b = _table(
        "the same inputs through other libraries, ms",
        ("shape", "op", "device", "prec", "this", "torch", "scipy", "PySCF", "speedup"),
        right=("this", "torch", "scipy", "PySCF", "speedup"),
    )
    for r in ran:
        cells = [_baseline_short(r.get(k)) for k in ("torch", "scipy", "pyscf")]
        marks |= {m for _, m in cells if m}
        b.add_row(
            r["shape"],
            _op(r["op"], used),
            r["device"],
            r["precision"],
            ms(r["linalg"]),
            *(c for c, _ in cells),
            ratio(r),
        )
    console.print(b)
    notes = [
        "torch = torch.linalg, scipy = scipy.linalg, PySCF = its pair kernel (libmp); "
        "speedup = PySCF ms / this ms (> 1: this program faster)"
    ]
    notes += [
        {
            "†": "† the inv_sqrt_eigh row's time (no Newton–Schulz in that library)",
            "‡": "‡ in fp64 (PySCF's pair kernel has no fp32)",
            "n/r": "n/r = not run (see the markdown report)",
        }[m]
        for m in sorted(marks)
    ]
    _legend(console, used, notes)


def _estimate_table(rep: dict, console) -> None:
    from rich.markup import escape

    est = rep.get("trn_estimate")
    if not (est and est["rows"]):
        return
    used = set()
    e = _table(
        "Trainium ESTIMATES (not measured; no Trainium hardware ran)",
        ("shape", "op", "device", "estimate ms", "bound", "est. GFLOP/s"),
        right=("estimate ms", "est. GFLOP/s"),
    )
    skipped = {}
    for r in est["rows"]:
        if r["status"] == "estimate":
            e.add_row(
                r["shape"],
                _op(r["op"], used),
                f"{r['device']} (est.)",
                f"{r['estimate_s'] * 1e3:.3g}",
                BOUND_SHORT.get(r["bound"], r["bound"]),
                f"{(r.get('gflops') or 0):.0f}",
            )
        else:
            skipped.setdefault((r["op"], r["reason"]), []).append(f"{r['shape']}/{r['device']}")
    console.print(e)
    _legend(console, used, ["bound: the engine the estimate is limited by (TensorE, VectorE, DMA)"])
    for (op, reason), where in skipped.items():
        console.print(f"[dim]not estimated: {op} ({escape(', '.join(where))}): {escape(reason)}[/dim]")


def _waters_tables(rep: dict, console) -> None:
    w = rep.get("waters")
    if not (w and w.get("rows")):
        return
    s = _table(
        "Water clusters: DF-MP2 stage after SCF, s",
        ("waters", "nbasis", "run", "prec", "median", "pair", "speedup"),
        right=("waters", "nbasis", "median", "pair", "speedup"),
    )
    for row in w["rows"]:
        for r in row["runs"]:
            if r["status"] != "ran":
                s.add_row(str(row["waters"]), str(row["nbasis"]), r["who"], r["precision"], "not run", "", "")
                continue
            s.add_row(
                str(row["waters"]),
                str(row["nbasis"]),
                f"{r['who']} {r['device']}",
                r["precision"],
                f"{r['time']['median_s']:.2f}",
                f"{r.get('stages_s', {}).get('pair', float('nan')):.2f}" if r["who"] == "dfmp2" else "",
                f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r else "",
            )
    console.print(s)
    console.print(
        "[dim]pair: the pair step's s; speedup = PySCF s / this s (> 1: this program faster)[/dim]", highlight=False
    )
    f = _table(
        f"cost exponents vs nbasis (nbasis >= {w['fit_min_nbasis']})", ("run", "stage", "p", "R²"), right=("p", "R²")
    )
    for label, entry in w["fits"].items():
        for stage, fe in entry.items():
            if stage != "nbasis" and fe.get("p") is not None:
                f.add_row(label, stage, f"{fe['p']:.2f}", f"{fe['r2']:.3f}")
    console.print(f)


def _radicals_table(rep: dict, console) -> None:
    rd = rep.get("radicals")
    if not (rd and rd.get("rows")):
        return
    t = _table(
        "Open shells: DF-UMP2 stage after SCF, s",
        ("molecule", "nbasis", "run", "prec", "median", "speedup"),
        right=("nbasis", "median", "speedup"),
    )
    for row in rd["rows"]:
        for r in row["runs"]:
            if r["status"] != "ran":
                t.add_row(row["radical"], str(row["nbasis"]), r["who"], r["precision"], "not run", "")
                continue
            t.add_row(
                row["radical"],
                str(row["nbasis"]),
                f"{r['who']} {r['device']}",
                r["precision"],
                f"{r['time']['median_s']:.2f}",
                f"{r['pyscf_over_this']:.2f}" if "pyscf_over_this" in r else "",
            )
    console.print(t)


def terminal(rep: dict, console) -> None:
    """The report's tables for a terminal, each within TERMINAL_WIDTH (80) columns: measured ops
    (two tables), devices that did not run, Trainium estimates, water clusters and exponents."""
    from rich.markup import escape  # reasons are exception texts, not markup

    _measured_tables(rep, console)
    for d in rep["devices"]:
        if d["status"] != "ran":
            console.print(f"[yellow]{escape(d['device'])}: not run[/] — {escape(d['reason'])}")
    _estimate_table(rep, console)
    _waters_tables(rep, console)
    _radicals_table(rep, console)


__all__ = [
    "BASELINE_LABELS",
    "atomic_write",
    "headline_rows",
    "markdown",
    "panel_titles",
    "plot",
    "plot_series",
    "series_colors",
    "terminal",
    "write_json",
]
