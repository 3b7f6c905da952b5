"""``dfmp2 regress``: the command (its options, progress bar and output); the regression itself
(references, case selection, runs, table, JSON) is dfmp2.workflows.regress."""

from __future__ import annotations

from pathlib import Path

import click

from dfmp2.cli.options import (
    device_options,
    one_process,
    printing,
    resource_options,
    run_options,
    scf_options,
    stdout_console,
    user_errors,
)
from dfmp2.errors import InputError
from dfmp2.workflows.regress import (
    REFERENCES,
    SUBSETS,
    TOLERANCES,
    choose_cases,
    load_references,
    render,
    run_case,
    write_json,
)


@click.command("regress")
@click.argument("names", nargs=-1)
@device_options(precision={"help": "working precision [default: fp64, fp32 on trn]"})
@scf_options(skip=("scf_mode",))  # the SCF mode is each reference's
@resource_options()
@click.option(
    "--subset",
    type=click.Choice(list(SUBSETS)),
    default=None,
    help="fast (seconds), full (fast + slow channel) or all (adds large reference-only "
    "cases) [default: fast; with NAMES: full, plus large cases named exactly]",
)
@click.option(
    "--tol",
    "tolerance",
    type=float,
    default=None,
    help="tolerance in Hartree on E_corr and E_HF [default: 1e-9 fp64, 1e-6 fp32]",
)
@click.option(
    "--references",
    "ref_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="reference file [default: inputs/references.json]",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="also write every case and the summary as JSON to this path",
)
@click.option("--list", "list_only", is_flag=True, help="list the selected cases and exit")
@user_errors
def regress_command(names, subset, tolerance, ref_path, json_path, list_only, **params):
    """Rerun molecules with PySCF reference energies and compare (exit 1 on any failure).

    NAMES are molecule names or shell patterns (e.g. water 'h2o_*' 's22_0?_*'); each case runs
    with its reference's basis sets, SCF mode and frozen core, and the options given here.
    """
    one_process("regress")
    from rich.console import Console
    from rich.markup import escape

    from dfmp2.io.outputs import check_output_file

    console, err = stdout_console(width=160), Console(stderr=True)  # piped: the whole table
    options = run_options(params)
    options.precision = precision = options.resolved_precision()
    tol = TOLERANCES[precision] if tolerance is None else tolerance
    if not 0 < tol < float("inf"):
        raise InputError(f"--tol must be a positive finite number, got {tolerance}")
    refs = load_references(ref_path)
    cases = choose_cases(refs, subset, names)
    if list_only:
        with printing():
            for e in cases:
                console.print(
                    f"{e['subset']:5s} {e['key']:60s} nbasis {e['nbasis']:4d} naux {e['naux']:5d}", markup=False
                )
        return
    if json_path is not None:  # before any case runs: a JSON that cannot be written fails now ('' too)
        check_output_file(json_path, "--json", not_same_as=[("reference file", ref_path if ref_path else REFERENCES)])
    from dfmp2.pipeline import make_backend

    options.check_choices()
    make_backend(options)  # fail before any work
    results = []
    from rich.progress import Progress, TimeElapsedColumn

    with Progress("[progress.description]{task.description}", TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task("", total=len(cases))
        for n, e in enumerate(cases, 1):
            bar.update(task, description=f"[{n}/{len(cases)}] {escape(e['key'])} (nbasis {e['nbasis']})")
            results.append(run_case(e, options, tolerance=tol))
            bar.advance(task)
    if json_path:  # before the table: a stdout that fails must not lose the result
        write_json(
            json_path,
            results,
            {
                "device": options.device,
                "simulate": options.simulate,
                "precision": precision,
                "tolerance": tol,
                "references": str(Path(ref_path) if ref_path else REFERENCES),
                "subset": subset,
                "names": list(names),
            },
        )
    with printing(written=(json_path,)):
        render(results, console, options.device, precision, tol)
    if json_path:
        err.print(f"[dim]wrote {escape(str(json_path))}[/dim]")
    if any(not r.passed for r in results):
        raise SystemExit(1)
