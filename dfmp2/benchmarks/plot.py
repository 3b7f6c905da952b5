"""The PNG plot of a ``dfmp2 bench`` report: one log-scale panel per op family (time per call at
each shape, Trainium estimates dashed and labelled), then the water clusters' DF-MP2 stage against
nbasis with the fitted power laws; one colour per series in every panel. matplotlib is imported
only when a figure is drawn.
"""

from __future__ import annotations

import io
from pathlib import Path

# the plot's op panels: one per family, its ops told apart by marker
OP_FAMILIES = {
    "GEMM": ("gemm",),
    "SYRK": ("syrk",),
    "TRSM": ("trsm",),
    "Cholesky": ("cholesky",),
    "inverse square root": ("inv_sqrt_eigh", "inv_sqrt_newton_schulz"),
    "pair energy": ("mp2_pair_energy", "mp2_pair_energy_os"),
}
PLOT_OPS = tuple(op for ops in OP_FAMILIES.values() for op in ops)
OP_MARKERS = {
    "gemm": "s",
    "syrk": "D",
    "trsm": "^",
    "cholesky": "v",
    "inv_sqrt_eigh": "o",
    "inv_sqrt_newton_schulz": "P",
    "mp2_pair_energy": "o",
    "mp2_pair_energy_os": "X",
}


def _series_key(who: str, device: str, precision: str) -> tuple:
    """One series of the plot, the same in both panels: ('dfmp2', device, precision), ('pyscf',
    'cpu', 'fp64') or ('estimate', device, 'fp32')."""
    return (who, device, precision)


def _series_label(key: tuple) -> str:
    who, device, precision = key
    return {
        "dfmp2": f"dfmp2 {device} {precision}",
        "pyscf": "PySCF cpu fp64",
        "estimate": f"{device} {precision} ESTIMATE",
    }[who]


def plot_series(rep: dict) -> tuple[dict, dict]:
    """What the plot draws: ({(series key, op): [(nbasis, s)]} of the left panel (per-op calls;
    Trainium estimates as their own series), {series key: [(nbasis, s)]} of the right panel (the
    water clusters' DF-MP2 stage)), each point list sorted."""
    dims = {s["name"]: s["nbasis"] for s in rep["shapes"]}
    ops: dict = {}
    for r in rep["ops"]:
        if r["status"] == "ran" and r["op"] in PLOT_OPS:
            ops.setdefault((_series_key("dfmp2", r["device"], r["precision"]), r["op"]), []).append(
                (dims[r["shape"]], r["linalg"]["median_s"])
            )
            if r["precision"] == "fp64" and isinstance(r.get("pyscf"), dict) and "median_s" in r["pyscf"]:
                ops.setdefault((_series_key("pyscf", "cpu", "fp64"), r["op"]), []).append(
                    (dims[r["shape"]], r["pyscf"]["median_s"])
                )
    for r in (rep.get("trn_estimate") or {}).get("rows", []):
        if r["status"] == "estimate" and r["op"] in PLOT_OPS:
            ops.setdefault((_series_key("estimate", r["device"], "fp32"), r["op"]), []).append(
                (dims[r["shape"]], r["estimate_s"])
            )
    waters: dict = {}
    for row in (rep.get("waters") or {}).get("rows", []):
        for r in row["runs"]:
            if r["status"] == "ran":
                key = (
                    _series_key("dfmp2", r["device"], r["precision"])
                    if r["who"] == "dfmp2"
                    else _series_key("pyscf", "cpu", "fp64")
                )
                waters.setdefault(key, []).append((row["nbasis"], r["time"]["median_s"]))
    return ({k: sorted(set(v)) for k, v in ops.items()}, {k: sorted(set(v)) for k, v in waters.items()})


def series_colors(ops: dict, waters: dict) -> dict:
    """One colour per series across both panels (matplotlib's C0, C1, ...): this program's runs
    first, then PySCF, then the estimates, each in sorted order."""
    keys = {k for k, _ in ops} | set(waters)
    order = {"dfmp2": 0, "pyscf": 1, "estimate": 2}
    return {k: f"C{i % 10}" for i, k in enumerate(sorted(keys, key=lambda k: (order[k[0]], k)))}


def panel_titles(rep: dict, ops: dict, waters: dict) -> tuple[str, str]:
    """The figure's note on the op panels and the water panel's title, naming only the line
    styles that are drawn: dashed hollow markers for Trainium estimates when there are any;
    dotted fitted power laws when a fit is drawn."""
    left = "per-op calls at DF-MP2 shapes, one panel per op family (colour: who ran it; marker: op"
    if any(k[0] == "estimate" for k, _ in ops):
        left += "; dashed, hollow: Trainium estimates, not measured"
    right = "water clusters, DF-MP2 stage after the SCF"
    fits = (rep.get("waters") or {}).get("fits", {})
    if any(fits.get(_fit_label(k), {}).get("total", {}).get("p") is not None for k in waters):
        right += " (dotted: fitted power law)"
    return left + ")", right


def _fit_label(key: tuple) -> str:
    """The label of a series in rep['waters']['fits'] (waters.py's)."""
    return f"dfmp2 {key[1]} {key[2]}" if key[0] == "dfmp2" else "pyscf cpu fp64"


def _op_panel(ax, family: str, rep: dict, ops: dict, colors: dict) -> None:
    """One op family's calls: time per call (log) at each shape (one tick per shape, named with
    its nbasis, so one shape reads as well as many); colour the series, marker the op."""
    shapes = sorted(rep["shapes"], key=lambda s: s["nbasis"])
    at = {s["nbasis"]: i for i, s in enumerate(shapes)}
    members = OP_FAMILIES[family]
    for (key, op), pts in sorted(ops.items(), key=lambda kv: (colors[kv[0][0]], kv[0][1])):
        if op not in members:
            continue
        est = key[0] == "estimate"
        ax.plot(
            [at[nb] for nb, _ in pts],
            [t for _, t in pts],
            linestyle="--" if est else "-",
            marker=OP_MARKERS.get(op, "o"),
            markersize=7,
            color=colors[key],
            fillstyle="none" if est else "full",
        )
    ax.set_yscale("log")
    ax.set_xticks(range(len(shapes)))
    ax.set_xticklabels([f"{s['name']}\n{s['nbasis']}" for s in shapes], fontsize=7)
    ax.set_xlim(-0.5, len(shapes) - 0.5)
    ax.set_ylabel("time per call / s", fontsize=8)
    drawn = [op for op in members if any(o == op for _, o in ops)]
    markers = ", ".join(f"{OP_MARKERS[o]}: {o}" for o in drawn)
    ax.set_title(family + (f" ({markers})" if len(drawn) > 1 else ""), fontsize=8)
    ax.grid(True, which="both", alpha=0.3)


def _right_panel(ax2, rep: dict, waters: dict, colors: dict, title: str) -> None:
    from matplotlib.ticker import NullFormatter

    w = rep["waters"]
    for key, pts in sorted(waters.items(), key=lambda kv: colors[kv[0]]):
        xs, ys = zip(*pts)
        f = w["fits"].get(_fit_label(key), {}).get("total", {})
        lab = _series_label(key) + (f" (p = {f['p']:.2f})" if f.get("p") is not None else "")
        ax2.plot(xs, ys, marker="o", color=colors[key], label=lab)
        if f.get("p") is not None:
            nb = w["fits"][_fit_label(key)]["nbasis"]
            xf = [min(nb), max(nb)]
            ax2.plot(xf, [f["c"] * x ** f["p"] for x in xf], linestyle=":", color=colors[key])
    ax2.set_xscale("log")
    ax2.set_yscale("log")
    rows = sorted(w["rows"], key=lambda r: r["nbasis"])
    ax2.set_xticks([row["nbasis"] for row in rows])
    ax2.set_xticklabels([f"{row['waters']}\n{row['nbasis']}" for row in rows], fontsize=7)
    ax2.xaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel("waters n / nbasis ((H2O)n, cc-pVDZ: 24 n)")
    ax2.set_ylabel("DF-MP2 stage after SCF / s")
    ax2.set_title(title, fontsize=8)
    ax2.legend(fontsize=7)
    ax2.grid(True, which="both", alpha=0.3)


def plot(rep: dict, path: Path) -> bool:
    """Write ``figure(rep)`` as a PNG to ``path``. Returns False (and writes nothing) without
    matplotlib. Written by dfmp2.io.outputs.write_bytes: a half-written plot never appears under
    ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig = figure(rep)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    from dfmp2.io.outputs import write_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes(path, buf.getvalue())  # atomic, with the umask's mode, as the JSON and markdown
    return True


def figure(rep: dict):
    """The report's matplotlib Figure: one log-scale panel per op family with data (``OP_FAMILIES``;
    time per call at each shape, one tick per shape; marker: the op; Trainium estimates dashed,
    hollow, labelled 'ESTIMATE'), then the water-cluster stage vs nbasis with the fitted power
    laws when there are water runs; one colour per series (who ran it, device, precision) in every
    panel (``series_colors``), and one legend of every series under the panels."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    ops, waters = plot_series(rep)
    colors = series_colors(ops, waters)
    note, right = panel_titles(rep, ops, waters)
    families = [f for f, members in OP_FAMILIES.items() if any(op in members for _, op in ops)]
    n = len(families) + bool(waters)
    ncols = min(3, max(n, 1))
    nrows = -(-max(n, 1) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.6 * ncols, 3.4 * nrows + 1.4), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, family in zip(flat, families):
        _op_panel(ax, family, rep, ops, colors)
    if waters:
        _right_panel(flat[len(families)], rep, waters, colors, right)
    for ax in flat[n:]:
        ax.set_visible(False)
    handles = [
        Line2D([], [], color=c, marker="o", linestyle="--" if k[0] == "estimate" else "-", label=_series_label(k))
        for k, c in sorted(colors.items(), key=lambda kv: int(kv[1][1:]))
    ]
    fig.legend(handles=handles, loc="lower center", ncol=min(4, max(len(handles), 1)), fontsize=7.5)
    m = rep["meta"]
    fig.suptitle(
        f"dfmp2 bench {m['date']} — {m['machine']['cpu']}, {m['machine']['torch_threads']} threads"
        + (" (machine loaded)" if m.get("machine_loaded") else "")
        + "\n"
        + note,
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.04 + 0.025 * -(-len(handles) // 4), 1, 1))
    return fig
