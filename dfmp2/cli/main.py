"""The ``dfmp2`` command line (click). User mistakes print one ``error:`` line and exit 2."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from dfmp2.cli.bench import bench_command
from dfmp2.cli.compare import compare_command
from dfmp2.cli.frequencies import frequencies_command
from dfmp2.cli.gradient import gradient_command, gradient_table, optimize_command
from dfmp2.cli.options import (
    cbs_options,
    checkpoint_options,
    device_options,
    method_options,
    molecule_options,
    printing,
    properties_options,
    resource_options,
    run_options,
    scf_options,
    stdout_console,
    user_errors,
)
from dfmp2.cli.regress import regress_command
from dfmp2.cli.runtime import LazyProgress, terminate_raises
from dfmp2.errors import EXIT_INTERRUPTED
from dfmp2.io.outputs import check_output_file, write_text


class OneLineErrorGroup(click.Group):
    """A click group whose usage errors (unknown option, bad choice, missing argument) are one
    ``error:`` line with the help hint in it, exit code 2, instead of click's usage block.

    Click shows a usage error only in ``main``'s standalone mode, so this runs click
    non-standalone and shows the exceptions itself; everything else is click's behaviour.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:  # bare 'dfmp2': the help, as click does
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            msg = " ".join(e.format_message().split())
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                msg += f" (see '{ctx.command_path} --help')"
            from dfmp2.distributed import launcher_rank

            if not launcher_rank():  # over several ranks every rank exits, rank 0 says why
                click.echo(f"error: {msg}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:  # Ctrl-C or EOF outside a command
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        # non-standalone click returns the exit code of --help/--version (ctx.exit) and the
        # command's return value otherwise (None for every dfmp2 command)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=OneLineErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dfmp2")
def main():
    """DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium."""


def _plan_table(plan):
    """The memory plan as a rich table (verbose mode)."""
    from rich.table import Table

    t = Table(title="memory plan", title_justify="left")
    t.add_column("stage")
    t.add_column("peak / MB", justify="right")
    t.add_column("what is resident")
    what = {
        "scf": "the DF-SCF's JK factor (fitted in fp64), one unpacked block, dense matrices",
        "metric": "j2c, its factor",
        "transform": "L, one (μν|P) block and its transforms, "
        + ("queued disk writes" if plan.out_of_core else "all of (P|ia)"),
        "fit": "L, "
        + ("read-ahead column blocks, queued writes" if plan.out_of_core else "(P|ia) becoming B block by block"),
        "pair": ("Bi, Bj and read-ahead blocks" if plan.out_of_core else "B") + ", pair workspace",
    }
    for stage, mb in plan.stages_mb.items():
        t.add_row(stage, f"{mb:,.1f}", what.get(stage, ""))
    t.add_section()
    t.add_row("peak", f"{plan.peak_mb:,.1f}", f"limit {plan.limit_mb:,.1f} MB")
    t.add_row(
        "B", f"{plan.b_mb:,.1f}", f"on disk (HDF5), {plan.disk_mb:,.1f} MB of disk" if plan.out_of_core else "in memory"
    )
    t.add_row("in memory would need", f"{plan.in_memory_mb:,.1f}", "")
    t.add_row("resident before", f"{plan.process_mb:,.1f}", "interpreter, libraries, molecule: outside the limit")
    if plan.integrals.get("host_mb"):
        t.add_row(
            "integral buffers",
            f"{plan.integrals['host_mb']:,.1f}",
            f"host memory (pinned), outside the plan: {plan.integrals['queue_depth']} packed blocks",
        )
    t.add_row(
        "smallest feasible",
        f"{plan.min_mb:,.1f}",
        "B on disk, smallest blocks" if plan.storage != "memory" else "B in memory, smallest blocks",
    )
    t.caption = (
        f"blocks: {plan.aux_block} auxiliary functions per (μν|P) block, "
        f"{plan.occ_block} occupied orbitals per fit / pair block; storage {plan.storage}"
    )
    return t


def _resume_hint(params) -> str:
    """After 'error: interrupted': how to continue, when the run left a checkpoint (one that held
    nothing to resume was removed, dfmp2.interfaces.api.run)."""
    ck = params.get("resume") or params.get("checkpoint")
    return f"; continue with: dfmp2 run {params['xyz_file']} ... --resume {ck}" if ck and Path(ck).exists() else ""


@main.command()
@click.argument("xyz_file", metavar="INPUT", type=click.Path(dir_okay=False))
@method_options()
@molecule_options()
@device_options()
@scf_options()
@resource_options()
@checkpoint_options()
@cbs_options()
@properties_options()
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="also write the result as JSON to this path",
)
@click.option(
    "--qcschema",
    "qcschema_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="also write a QCSchema AtomicResult to this path (a FailedOperation when the run fails); needs qcelemental",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="print the memory plan (stages, blocks, where B lives), each stage's GF/s and, on the cpu, the BLAS "
    "choice with its measurements (GF/s, spreads, load)",
)
@click.option("-q", "--quiet", is_flag=True, help="print only the energies table")
@user_errors(interrupted=_resume_hint)
def run(xyz_file, json_path, qcschema_path, verbose, quiet, **params):
    """Compute the DF-MP2 energy of the molecule in INPUT: an XYZ file (coordinates in Ångström)
    or a QCSchema AtomicInput (*.json: molecule in Bohr, model mp2 and basis, keywords)."""
    from dfmp2 import distributed

    world = distributed.join(params["device"])  # several ranks (torchrun): the process group
    with distributed.command(world):
        _run(world, xyz_file, json_path, qcschema_path, verbose, quiet, params)


def _run(world, xyz_file, json_path, qcschema_path, verbose, quiet, params):
    """``run`` on this rank (every rank checks everything; rank 0 alone prints and writes)."""
    from dfmp2.errors import InputError
    from dfmp2.interfaces import api
    from dfmp2.io.result import Result, cpu_blas_table
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows import cbs

    if world.rank:
        quiet, qcschema_path = True, None
    console = stdout_console()
    err = Console(stderr=True)
    options = run_options(params)
    ck, resume = options.checkpoint, options.resume
    if cbs.is_bracket(options.basis):  # a malformed bracket or scheme: one line before any work
        cbs.scheme(options.basis, options.cbs_scf)
        if qcschema_path is not None:
            raise InputError(
                "a QCSchema AtomicResult holds one basis; write a CBS extrapolation with --json", option="basis"
            )
    if json_path is not None:  # before any work: a JSON that cannot be written fails now ('' too)
        check_output_file(
            json_path, "--json", not_same_as=[("input", xyz_file), ("checkpoint", ck), ("checkpoint", resume)]
        )
    qc = _qcschema_path(xyz_file, qcschema_path, json_path, ck, resume)
    ctx = click.get_current_context()
    given = {p for p in ctx.params if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE}
    failures = qc.FailedOperationOnError(qcschema_path) if qc else contextlib.nullcontext()
    progress = LazyProgress(err, "pair energies", enabled=not quiet)
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    on_plan = (lambda plan: err.print(_plan_table(plan))) if verbose and not world.rank else None
    if verbose and world.distributed:  # each rank its own line: its share of B
        from dfmp2.mp2.dist import plan_printer

        on_plan = plan_printer(world, on_plan, lambda line: err.print(escape(line)))
    try:
        with terminate_raises(), failures:
            if qc and qc.is_qcschema_path(xyz_file):  # v1 or v2, run in process as run_qcschema does
                failures.input_data = qc.read_raw(xyz_file)
                atomic, result = qc.run_atomic_input(
                    failures.input_data,
                    options,
                    given=given,
                    where=xyz_file,
                    progress=progress,
                    log=log,
                    on_plan=on_plan,
                )
            else:
                geom = read_xyz(xyz_file)
                parts = qc.ScfEnergyParts() if qc else None
                if qc:
                    failures.input_data = qc.input_from_run(geom, options)
                if cbs.is_bracket(options.basis):  # no qc here: --qcschema with a bracket is refused above
                    result = cbs.run_cbs(geom, options, progress=progress, log=log, on_plan=on_plan)
                else:
                    result = api.run(geom, options, progress=progress, log=log, on_plan=on_plan, on_reference=parts)
                atomic = (
                    qc.result_model(*qc.input_model(failures.input_data, xyz_file), result, parts.values)
                    if qc
                    else None
                )
    finally:
        progress.close()
    if world.rank:  # rank 0 alone prints and writes
        return
    qc_text = qc.to_json(atomic) if qcschema_path else None  # validated before any output
    # the files first: a stdout that fails (full, or a reader gone) must not lose the result
    try:
        if json_path:
            result.write_json(json_path)
        if qcschema_path:
            write_text(qcschema_path, qc_text)
    except InputError as e:  # the finished run's checkpoint stays: a resume writes the files again
        if ck and Path(ck).exists():
            raise InputError(
                f"{e}; the finished run is kept in the checkpoint {ck}: "
                f"dfmp2 run {xyz_file} ... --resume {ck} writes it without recomputing",
                option=e.option,
            ) from None
        raise
    gradient = result if hasattr(result, "gradient") else None  # a QCSchema input's driver 'gradient'
    result = gradient.result if gradient is not None else result
    with printing(written=(json_path, qcschema_path)):
        if verbose and isinstance(result, Result):  # a CBS document has no stages of its own
            result.render(console, quiet=quiet, verbose=True)
        else:
            result.render(console, quiet=quiet)
        if gradient is not None:  # as dfmp2 gradient prints it
            console.print(gradient_table(gradient))
            for w in gradient.parts.warnings:
                console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    blas = result.ran.get("cpu_blas")
    if verbose and blas and cpu_blas_table(blas) is not None:  # the choice and its evidence
        err.print(cpu_blas_table(blas))
    for path in (json_path, qcschema_path):
        if path and not quiet:
            err.print(f"[dim]wrote {escape(str(path))}[/dim]")


def _qcschema_path(input_path, qcschema_path, *others):
    """The qcschema module when the run reads or writes QCSchema (qcelemental checked now, before
    any work), else None; ``--qcschema`` is checked like ``--json``."""
    from dfmp2.interfaces import qcschema

    if qcschema_path is None and not qcschema.is_qcschema_path(input_path):
        return None
    qcschema.models()
    if qcschema_path is not None:  # '' too: refused as no file name
        json_path, ck, resume = others
        check_output_file(
            qcschema_path,
            "--qcschema",
            not_same_as=[("input", input_path), ("--json", json_path), ("checkpoint", ck), ("checkpoint", resume)],
        )
    return qcschema


@main.command()
@click.argument("xyz_file", type=click.Path(dir_okay=False))
@click.option(
    "--fragments",
    default=None,
    metavar="1-3,4-6",
    help="atoms of each fragment, 1-based; commas separate fragments, '+' joins parts of "
    "one (1-3+7,4-6) [default: the '--' lines of the XYZ file]",
)
@click.option(
    "--fragment-charges",
    default=None,
    metavar="0,0",
    help="charge of each fragment; they must add up to the total charge [default: the "
    "XYZ's 'charge multiplicity' fragment lines, else 0 each]",
)
@click.option(
    "--fragment-multiplicities",
    default=None,
    metavar="1,1",
    help="multiplicity (2S+1) of each fragment [default: the XYZ's fragment lines, else 1 each]",
)
@molecule_options(
    charge={"help": "total charge [default: XYZ comment, else the sum of --fragment-charges]"},
    multiplicity={"help": "total multiplicity [default: XYZ comment, else the fragments' high-spin coupling]"},
    frozen_core={"help": "freeze the chemical core orbitals in MP2 (ghost atoms have none)"},
)
@device_options(device={"help": "where the linear algebra of every run goes"})
@scf_options()
@resource_options(
    memory_mb={"help": "memory limit per run, e.g. 8GB [default: 80% of available]"},
    storage={"help": "where B lives in each run: in memory if the plan fits, else on disk (auto), or forced"},
)
@cbs_options()
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="also write the interaction energies, every run's energies and what ran as JSON",
)
@click.option("-q", "--quiet", is_flag=True, help="print only the interaction energies")
@user_errors
def interaction(xyz_file, fragments, fragment_charges, fragment_multiplicities, json_path, quiet, **params):
    """Interaction energy of the fragments in XYZ_FILE (Ångström), counterpoise-corrected and not.

    Runs DF-MP2 on the full system, on each fragment in the full basis (the other atoms as ghost
    atoms with their orbital and fitting basis sets) and on each fragment in its own basis, all
    on one device; prints ΔE(HF), ΔE(MP2), ΔE(SCS-MP2) in Eh and kcal/mol.
    """
    from dfmp2 import distributed

    world = distributed.join(params["device"])  # torchrun: the runs are dealt to the ranks
    with distributed.command(world):
        _interaction(world, xyz_file, fragments, fragment_charges, fragment_multiplicities, json_path, quiet, params)


def _interaction(world, xyz_file, fragments, fragment_charges, fragment_multiplicities, json_path, quiet, params):
    """``interaction`` on this rank (every rank checks everything and runs its share of the runs;
    rank 0 alone prints and writes)."""
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows.interaction import resolve_fragments, run_interaction

    console = stdout_console(width=120)  # files and pipes get the whole table
    err = Console(stderr=True)
    with world.agreeing():  # a refusal on one rank ends every rank, before any work
        geom = read_xyz(xyz_file)
        frags = resolve_fragments(
            geom, fragments, fragment_charges, fragment_multiplicities, params["charge"], params["multiplicity"]
        )
        options = run_options(params)
        if json_path is not None and not world.rank:  # before any work ('' too: refused as no file name)
            check_output_file(json_path, "--json", not_same_as=[("input", xyz_file)])
    quiet = quiet or bool(world.rank)
    progress = LazyProgress(err, "pair energies", enabled=not quiet)
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    try:
        with terminate_raises():
            result = run_interaction(geom, frags, options, log=log, progress=progress, world=world)
    finally:
        progress.close()
    if world.rank:  # rank 0 alone writes and prints
        return
    if json_path:  # before the table: a stdout that fails must not lose the result
        result.write_json(json_path)
    with printing(written=(json_path,)):
        result.render(console, quiet=quiet)
    if json_path and not quiet:
        err.print(f"[dim]wrote {escape(str(json_path))}[/dim]")


main.add_command(regress_command, "regress")

main.add_command(compare_command, "compare")

main.add_command(bench_command, "bench")

main.add_command(gradient_command, "gradient")
main.add_command(optimize_command, "optimize")
main.add_command(frequencies_command, "frequencies")


if __name__ == "__main__":
    main()
