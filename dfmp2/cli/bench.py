"""``dfmp2 bench``: per-shape timing reports (terminal table, JSON, markdown, PNG).

    dfmp2 bench                                    # CPU report: small/medium/large + (H2O)1-24
    dfmp2 bench --waters 1-32 --pyscf-max-waters 32 # the full series (much longer: see below)
    dfmp2 bench --out scripts/results --name dfmp2_bench_cpu
    dfmp2 bench --shapes "small;32,300,1000" --precisions fp32 --waters none
    dfmp2 bench --devices cpu,cuda --waters 1-16   # on a GPU machine (see also scripts/bench_cuda.py)

What it measures (details in dfmp2/benchmarks/):
- the GEMM peak of each device and precision, in the same run;
- each linalg op (gemm, syrk, trsm, cholesky, A^-1/2 by eigh and by Newton-Schulz, the fused
  pair energy) at the size one call of the DF-MP2 stage has for each shape, against
  torch.linalg, scipy.linalg and PySCF's pair kernel on identical (Philox) inputs;
- the whole DF-MP2 stage after the SCF on water clusters against PySCF's DFMP2, and the fitted
  cost exponent of each stage. Default series (H2O)1-24, PySCF at every size, single runs for
  clusters over --single-above seconds, to stay under 15 minutes on 2 quiet cores: (H2O)24 is
  the most expensive point (its SCF, our stage and PySCF's stage each cost about as much as all
  the per-shape ops together) and (H2O)32 (nbasis 768, pair step 2.5e13 flop) several times
  that, so it is opt-in (run times: scripts/results/dfmp2_bench_cpu.md and
  scripts/results/dfmp2_bench_cpu_waters1-32.md);
- for trn1/trn2 without hardware: ESTIMATES from the NKI kernels' work and published rates,
  in their own section, never mixed with measured times.
A device that cannot run is listed as not run with the reason. Exit status 0 when the report
was written, 2 for bad options.

    dfmp2 bench --blas                             # only re-measure the cpu BLAS choice, cache it

``--blas`` runs the probe of ``--cpu-blas auto`` (linalg/cpu_blas.py) now, whatever the cache
holds, writes the cache and prints the table (GF/s, spreads, other processes' cores).
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from pathlib import Path

import click

from dfmp2.cli.options import printing, stderr_console, stdout_console, user_errors
from dfmp2.errors import InputError
from dfmp2.options import DEVICE_CHOICES, PRECISIONS


def _split(text: str, what: str, allowed=None) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"--{what}: give a comma-separated list")
    if allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise InputError(f"--{what}: unknown {', '.join(bad)}; choose from {', '.join(allowed)}")
    return items


def check_outputs(out_dir, name: str) -> None:
    """Before any timing: ``name`` is a plain file stem (NAME.json, .md, .png go into ``out_dir``,
    nowhere else) and ``out_dir`` is, or can be made, a directory that takes files."""
    from dfmp2.io.outputs import check_output_dir, check_output_file

    seps = {"/", "\\", os.sep} | ({os.altsep} if os.altsep else set())
    if name in ("", ".", "..") or any(c in name for c in seps | {"\0"}):
        raise InputError(f"--name '{name}': give a file stem without '/' or '..' (the files go into --out)")
    out = check_output_dir(out_dir, "--out", create=True)
    if out.is_dir():
        for suffix in (".json", ".md", ".png"):
            check_output_file(out / f"{name}{suffix}", "--out/--name")


def _rerender(path: Path, console) -> None:
    """Rewrite NAME.md and NAME.png of a saved bench report and print its tables. A file that is
    not a bench report is an InputError before anything is written: it must be JSON with the
    report's schema tag, and the markdown and tables must render from it."""
    import io
    import json

    from rich.console import Console

    from dfmp2.benchmarks import report

    try:
        rep = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise InputError(
            f"{path}: not a dfmp2 bench report (cannot read it as JSON: {' '.join(str(e).split())[:80]})"
        ) from None
    if not isinstance(rep, dict) or rep.get("schema") != report.SCHEMA:
        raise InputError(
            f'{path}: not a dfmp2 bench report (no "schema": "{report.SCHEMA}"); '
            "give a NAME.json written by dfmp2 bench"
        )
    # the tables read many fields; rendering them into memory first finds any that is missing or
    # of the wrong type before a file is touched
    try:
        report.markdown(rep)
        report.terminal(rep, Console(file=io.StringIO(), width=160))
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, ZeroDivisionError) as e:
        raise InputError(
            f"{path}: damaged dfmp2 bench report ({e.__class__.__name__}: {' '.join(str(e).split())[:60]})"
        ) from None
    png = path.with_suffix(".png")
    rep["plot"] = str(png) if report.plot(rep, png) else None  # written atomically (outputs)
    report.atomic_write(path.with_suffix(".md"), report.markdown(rep))
    report.terminal(rep, console)


def _write_report(rep: dict, out_dir, name: str, log, console, err) -> None:
    """The report's files (``name``.json, .md and, with matplotlib, .png under ``out_dir``), its
    tables on stdout and one line on ``err`` naming what was written and whether the machine was
    loaded."""
    from rich.markup import escape

    from dfmp2.benchmarks import report

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    png = out / f"{name}.png"
    if report.plot(rep, png):
        rep["plot"] = str(png)
    else:
        rep["plot"] = None
        log("matplotlib is not installed: no plot (pip install matplotlib)")
    rep["meta"]["report_s"] = time.perf_counter() - t0
    report.write_json(rep, out / f"{name}.json")
    report.atomic_write(out / f"{name}.md", report.markdown(rep))
    with printing(written=(out / f"{name}.json", out / f"{name}.md")):
        report.terminal(rep, console)
    m = rep["meta"]
    busy = (
        f"other processes took {m['other_cpu']['other_cores']:.2f} cores"
        if m.get("other_cpu")
        else f"1-min load {max(m['load_average_before'][0], m['load_average_after'][0]):.1f}"
    )
    err.print(
        f"wrote {escape(str(out / name))}.json, .md"
        + (", .png" if rep["plot"] else "")
        + f" in {m['wall_s']:.0f} s"
        + (f"; machine loaded ({busy})" if m["machine_loaded"] else "")
    )


def _remeasure_blas(threads, quiet: bool) -> None:
    """``--blas``: the cpu BLAS probe now (linalg.cpu_blas.remeasure), written to the cache that
    ``--cpu-blas auto`` reads, its table on stdout. Any other timing option is refused (it would
    be ignored); a cache that cannot be written is an error after the table is printed."""
    from rich.markup import escape

    from dfmp2 import linalg
    from dfmp2.io.result import cpu_blas_table

    ctx = click.get_current_context()
    given = [
        p.opts[0]
        for p in ctx.command.params
        if p.name not in ("blas", "threads", "quiet")
        and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE
    ]
    if given:
        raise InputError(f"--blas re-measures the cpu BLAS choice only; drop {', '.join(given)} (or --blas)")
    if threads:
        import torch

        torch.set_num_threads(threads)
    err = stderr_console()
    if not quiet:
        err.print("[dim]measuring the cpu BLAS choice (a few seconds; keep the machine quiet)[/dim]")
    r = linalg.cpu_blas.remeasure("dfmp2 bench --blas")
    d = linalg.cpu_blas.CpuBlas("auto").describe()  # the table just measured (this process's memo)
    with printing():
        stdout_console().print(cpu_blas_table(d))
    if r.cache_error:
        raise InputError(
            f"cannot write the cpu BLAS cache {d['cache']} ({r.cache_error}); "
            "set XDG_CACHE_HOME to a writable directory"
        )
    if not quiet:
        trusted = "later runs use it" if d["status"] == "clean" else "not trusted: the next run measures again"
        err.print(f"wrote {escape(d['cache'])} ({d['status']}: {trusted})")


@click.command("bench")
@click.option(
    "--shapes",
    default="small,medium,large",
    show_default=True,
    help="named shapes (small, medium, large, xlarge, h2o32, xxlarge), comma-separated; explicit "
    "NOCC,NVIR,NAUX shapes separated by ';', e.g. 'small;32,300,1000'",
)
@click.option(
    "--devices",
    default="cpu,cuda,trn1,trn2",
    show_default=True,
    help="devices to report; one that cannot run is listed as not run (trn1/trn2 without hardware "
    "get estimates instead)",
)
@click.option("--precisions", default=",".join(PRECISIONS), show_default=True)
@click.option(
    "--ops",
    "ops_",
    default=None,
    help="comma list of gemm, syrk, trsm, cholesky, inv_sqrt_eigh, inv_sqrt_newton_schulz, "
    "mp2_pair_energy [default: all]",
)
@click.option(
    "--waters",
    default="1-24",
    show_default=True,
    help="water clusters for the scaling series, e.g. 1-32, 1,2,4,8 or none",
)
@click.option("--water-precisions", default="fp64", show_default=True)
@click.option(
    "--radicals",
    default="none",
    show_default=True,
    help="open-shell series (DF-UMP2 stage vs PySCF's DFUMP2): none, default (OH, CH3, NO, allyl, "
    "t-butyl, glycyl), all, or names from inputs/open_shell/",
)
@click.option(
    "--pyscf-max-waters",
    type=int,
    default=24,
    show_default=True,
    help="run PySCF's DF-MP2 baseline for clusters up to this size",
)
@click.option(
    "--fit-min-nbasis",
    type=int,
    default=192,
    show_default=True,
    help="fit cost exponents over clusters with at least this many basis functions",
)
@click.option(
    "--repeats",
    type=click.IntRange(1, 100),
    default=3,
    show_default=True,
    help="minimum timed calls per op (fewer when a call exceeds --max-time)",
)
@click.option("--warmup", type=click.IntRange(0, 10), default=1, show_default=True)
@click.option(
    "--min-time",
    type=float,
    default=0.2,
    show_default=True,
    help="keep repeating a call until this many seconds were timed",
)
@click.option(
    "--max-time",
    type=float,
    default=2.0,
    show_default=True,
    help="stop adding timed calls after this many seconds (at least one call runs)",
)
@click.option(
    "--single-above",
    type=float,
    default=3.0,
    show_default=True,
    help="calls expected to take longer than this (s, from flops / GEMM peak) run once without warm-up",
)
@click.option(
    "--threads", type=click.IntRange(min=1), default=None, help="torch and PySCF threads [default: the libraries' own]"
)
@click.option(
    "--peak-n",
    type=click.IntRange(16, 32768),
    default=None,
    help="size of the square GEMM for the peak, 16-32768 [cpu 2048, cuda 8192]",
)
@click.option(
    "--trn-validate/--no-trn-validate",
    default=True,
    show_default=True,
    help="check the Trainium work model against the NKI emulator's counters at the smallest shape",
)
@click.option(
    "--out",
    "out_dir",
    default="bench-results",
    show_default=True,
    type=click.Path(file_okay=False),
    help="output directory",
)
@click.option("--name", default="bench", show_default=True, help="file stem: NAME.json, NAME.md, NAME.png")
@click.option("-q", "--quiet", is_flag=True, help="no progress lines, only the final tables")
@click.option(
    "--blas",
    is_flag=True,
    help="only re-measure the cpu BLAS choice now (torch's vs numpy's OpenBLAS per op, precision and "
    "size), write it to the cache --cpu-blas auto reads and print it with GF/s, spreads and load",
)
@click.option(
    "--rerender",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="no timing: rewrite the .md and .png (and the terminal table) of a saved NAME.json",
)
@user_errors(interrupted=lambda params: " (nothing written)")
def bench_command(rerender, blas, threads, quiet, out_dir, name, **params):
    """Per-shape timing report: ops and the DF-MP2 stage, measured, with baselines and estimates."""
    from rich.markup import escape

    if rerender:
        with printing():
            _rerender(Path(rerender), stdout_console())
        return
    if blas:
        _remeasure_blas(threads, quiet)
        return
    from dfmp2.benchmarks.run import run_bench

    opts = _bench_options(threads, **params)
    _check_memory(opts)
    check_outputs(out_dir, name)
    console = stdout_console()
    err = stderr_console()
    log = (lambda msg: None) if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]", highlight=False))
    rep = run_bench(opts, log=log)
    _write_report(rep, out_dir, name, log, console, err)


def _bench_options(  # noqa: PLR0913
    threads,
    shapes,
    devices,
    precisions,
    ops_,
    waters,
    water_precisions,
    radicals,
    min_time,
    max_time,
    single_above,
    **params,
):
    """The BenchOptions of the command's options, checked (one line for a bad value); ``threads``
    set for torch and PySCF now."""
    from dfmp2 import linalg
    from dfmp2.benchmarks import ops as ops_mod
    from dfmp2.benchmarks import radicals as radicals_mod
    from dfmp2.benchmarks import shapes as shapes_mod
    from dfmp2.benchmarks import waters as waters_mod
    from dfmp2.benchmarks.run import BenchOptions

    for opt, v in (("--min-time", min_time), ("--max-time", max_time), ("--single-above", single_above)):
        if not (math.isfinite(v) and v >= 0):
            raise InputError(f"{opt} must be a finite number of seconds >= 0, got {v}")
    if threads:
        import torch
        from pyscf import lib

        torch.set_num_threads(threads)
        lib.num_threads(threads)
    prec = _split(precisions, "precisions", PRECISIONS)
    devs = _split(devices, "devices")
    for d in devs:
        try:
            linalg.device_capabilities(d)
        except ValueError:
            raise InputError(f"--devices: unknown device '{d}'; use {', '.join(DEVICE_CHOICES)}") from None
    return BenchOptions(
        shapes=shapes_mod.parse_shapes(shapes),
        devices=devs,
        precisions=prec,
        ops=_split(ops_, "ops", ops_mod.OPS) if ops_ else list(ops_mod.OPS),
        waters=waters_mod.parse_waters(waters),
        radicals=radicals_mod.parse_radicals(radicals),
        water_precisions=_split(water_precisions, "water-precisions", PRECISIONS),
        min_time=min_time,
        max_time=max_time,
        single_above_s=single_above,
        command="dfmp2 bench " + " ".join(shlex.quote(a) for a in sys.argv[2:])
        if len(sys.argv) > 1 and sys.argv[1] == "bench"
        else "dfmp2 bench (called from Python)",
        **params,  # pyscf_max_waters, fit_min_nbasis, warmup, repeats, peak_n, trn_validate: same names
    )


def _check_memory(opts) -> None:
    """Before any allocation: a shape larger than host memory is one line (host; a GPU's own
    check is its run's)."""
    from dfmp2.memory import check_synthetic_memory

    for s in opts.shapes:
        for p in opts.precisions:
            what = f"--shapes {s.name} ({s.nocc},{s.nvir},{s.naux}), {p}"
            check_synthetic_memory(what, s.nocc, s.nvir, s.naux, 8 if p == "fp64" else 4, [])
