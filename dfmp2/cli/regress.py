"""``dfmp2 regress``: the command (its options, progress bar and output); the regression itself
(references, case selection, runs, table, JSON) is dfmp2.workflows.regress."""

from __future__ import annotations

from pathlib import Path

import click

from dfmp2.cli.options import (
    device_options,
    json_option,
    printing,
    resource_options,
    run_options,
    scf_options,
    stderr_console,
    stdout_console,
    user_errors,
    wrote,
)
from dfmp2.errors import InputError
from dfmp2.workflows.regress import (
    REFERENCES,
    SUBSETS,
    TOLERANCES,
    cases_content,
    choose_cases,
    load_references,
    rank_options,
    render,
    run_cases,
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
@json_option("also write every case and the summary as JSON to this path")
@click.option("--list", "list_only", is_flag=True, help="list the selected cases and exit")
@user_errors
def regress_command(names, subset, tolerance, ref_path, json_path, list_only, **params):
    """Rerun molecules with PySCF reference energies and compare (exit 1 on any failure).

    NAMES are molecule names or shell patterns (e.g. water 'h2o_*' 's22_0?_*'); each case runs
    with its reference's basis sets, SCF mode and frozen core, and the options given here.
    Under torchrun the cases are dealt to the ranks (each a one-process run; the same energies),
    or with --ranks-per-run to groups of ranks (each case a run over its group).
    """
    from dfmp2 import distributed

    # several ranks (torchrun): the cases dealt to them, their results gathered over gloo whatever
    # the device (small objects; each rank's cases on its own device, ``rank_options``)
    world = distributed.join("cpu")
    with distributed.command(world):
        code = _regress(world, names, subset, tolerance, ref_path, json_path, list_only, params)
    if code:  # every rank the same verdict, after leaving the group in order
        raise SystemExit(code)


def _regress(world, names, subset, tolerance, ref_path, json_path, list_only, params) -> int:
    """``regress`` on this rank (every rank checks everything and runs its share of the cases;
    rank 0 alone prints and writes); the exit status."""

    from dfmp2 import distributed
    from dfmp2.drivers.energy import make_backend
    from dfmp2.io.outputs import check_output_file
    from dfmp2.workflows.tasks import per_group

    console, err = stdout_console(json_path), stderr_console()  # JSON on stdout: the tables on stderr
    with world.agreeing():  # a refusal on one rank ends every rank, before any work
        options = run_options(params)
        options.precision = precision = options.resolved_precision()
        tol = TOLERANCES[precision] if tolerance is None else tolerance
        if not 0 < tol < float("inf"):
            raise InputError(f"--tol must be a positive finite number, got {tolerance}")
        refs = load_references(ref_path)
        cases = choose_cases(refs, subset, names)
        if not list_only:
            if json_path is not None and not world.rank:  # before any case runs ('' too)
                check_output_file(
                    json_path, "--json", not_same_as=[("reference file", ref_path if ref_path else REFERENCES)]
                )
            options.check_choices()
            make_backend(rank_options(options, world))  # fail before any work
        group_size = distributed.check_groups(options, world)  # each case over a group of ranks
    world.agree(None, cases_content(cases, options, tol))  # every rank the same cases and options
    if list_only:
        if not world.rank:
            with printing():
                for e in cases:
                    console.print(
                        f"{e['subset']:5s} {e['key']:60s} nbasis {e['nbasis']:4d} naux {e['naux']:5d}", markup=False
                    )
        return 0
    results = _run_with_progress(cases, options, tol, world, group_size, err)
    if world.rank:  # rank 0 alone writes and prints
        return 1 if any(not r.passed for r in results) else 0
    if json_path:  # before the table: a stdout that fails must not lose the result
        meta = {
            "device": options.device,
            "simulate": options.simulate,
            "precision": precision,
            "tolerance": tol,
            "references": str(Path(ref_path) if ref_path else REFERENCES),
            "subset": subset,
            "names": list(names),
            "world_size": world.size,
        }
        if world.distributed:  # case k ran on rank k mod N (group k mod N/G); its seconds were timed there
            dealt = per_group(len(cases), world, group_size)
            meta["ranks"] = {"comm_backend": world.comm_backend} | (
                {"ranks_per_run": group_size, "cases_per_group": dealt} if group_size > 1 else {"cases_per_rank": dealt}
            )
        write_json(json_path, results, meta)
    with printing(written=(json_path,)):
        render(results, console, options.device, precision, tol, world_size=world.size)
    wrote(err, json_path)
    return 1 if any(not r.passed for r in results) else 0


def _run_with_progress(cases, options, tol, world, group_size, err) -> list:
    """This rank's share of ``cases`` (its group's, with ``group_size`` > 1), under a progress bar
    on ``err`` that rank 0 alone shows: every case's result, gathered."""
    from rich.markup import escape
    from rich.progress import Progress, TimeElapsedColumn

    from dfmp2.workflows.tasks import per_group

    mine = per_group(len(cases), world, group_size)[world.rank // group_size]  # this rank's cases (tasks.deal)
    with Progress(
        "[progress.description]{task.description}",
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=bool(world.rank),  # rank 0 alone talks to the user
    ) as bar:
        task = bar.add_task("", total=mine)
        started = []

        def on_case(k, e):
            if started:  # the previous case of this rank is done
                bar.advance(task)
            started.append(k)
            bar.update(task, description=f"[{k + 1}/{len(cases)}] {escape(e['key'])} (nbasis {e['nbasis']})")

        return run_cases(cases, options, tol, world=world, on_case=on_case, group_size=group_size)
