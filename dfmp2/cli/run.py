"""``dfmp2 run``: the DF-MP2 energy of one molecule (an XYZ file or a QCSchema AtomicInput), a
CBS bracket's extrapolation, or a double hybrid's energy; the table, and --json / --qcschema."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click
from rich.markup import escape

from dfmp2.cli.gradient import gradient_table
from dfmp2.cli.options import (
    blas_notices,
    cbs_options,
    check_stdin,
    checkpoint_options,
    device_options,
    json_option,
    method_options,
    molecule_options,
    printing,
    properties_options,
    resource_options,
    run_options,
    scf_options,
    stderr_console,
    stdout_console,
    user_errors,
    wrote,
)
from dfmp2.cli.runtime import LazyProgress, terminate_raises
from dfmp2.io.outputs import check_output_file, write_text


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


@click.command("run")
@click.argument("xyz_file", metavar="INPUT", type=click.Path(dir_okay=False))
@method_options()
@molecule_options()
@device_options()
@scf_options()
@resource_options()
@checkpoint_options()
@cbs_options()
@properties_options()
@json_option("also write the result as JSON to this path ('-': to standard output, the tables then on stderr)")
@click.option(
    "--qcschema",
    "qcschema_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="also write a QCSchema AtomicResult to this path (a FailedOperation when the run fails; '-': to "
    "standard output, the tables then on stderr); needs qcelemental",
)
@click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="print the memory plan (stages, blocks, where B lives), each stage's GF/s and, on the cpu, the BLAS "
    "choice with its measurements (GF/s, spreads, load)",
)
@click.option("-q", "--quiet", is_flag=True, help="print only the energies table")
@click.option(
    "--profile",
    is_flag=True,
    help="also record where the time and bytes go (torch.profiler): per stage and per part of the SCF's "
    "cycles the wall, host and device seconds, bytes moved host<->device, ops and host waits, and the top "
    "kernels; printed after the result and in --json's 'profile'. One XYZ input and one basis; the parts "
    "of the SCF are synchronised, so the run is somewhat slower",
)
@user_errors(interrupted=_resume_hint)
def run_command(xyz_file, json_path, qcschema_path, verbose, quiet, profile, **params):
    """Compute the DF-MP2 energy of the molecule in INPUT: an XYZ file (coordinates in Ångström)
    or a QCSchema AtomicInput (*.json: molecule in Bohr, model mp2 and basis, keywords).
    INPUT '-' reads the XYZ from standard input."""
    from dfmp2 import distributed

    world = distributed.join(params["device"])  # several ranks (torchrun): the process group
    with distributed.command(world):
        _run(world, xyz_file, json_path, qcschema_path, verbose, quiet, params, profile)


def _run(world, xyz_file, json_path, qcschema_path, verbose, quiet, params, profile=False):
    """``run`` on this rank (every rank checks everything; rank 0 alone prints and writes)."""
    if world.rank:
        quiet, qcschema_path = True, None
    err = stderr_console()
    options = run_options(params)
    check_stdin(xyz_file, world)
    qc = _check_outputs(xyz_file, json_path, qcschema_path, options, profile)
    ctx = click.get_current_context()
    given = {p for p in ctx.params if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE}
    progress = LazyProgress(err, "pair energies", enabled=not quiet)
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    on_plan = (lambda plan: err.print(_plan_table(plan))) if verbose and not world.rank else None
    if verbose and world.distributed:  # each rank its own line: its share of B
        from dfmp2.mp2.dist import plan_printer

        on_plan = plan_printer(world, on_plan, lambda line: err.print(escape(line)))
    try:
        atomic, result = _compute(
            xyz_file, qcschema_path, qc, options, given, dict(progress=progress, log=log, on_plan=on_plan), profile
        )
    finally:
        progress.close()
    if world.rank:  # rank 0 alone prints and writes
        return
    _write_and_print(xyz_file, json_path, qcschema_path, qc, atomic, result, options, verbose, quiet, err)
    blas_notices(err, quiet)


def _check_outputs(xyz_file, json_path, qcschema_path, options, profile=False):
    """Before any work: a malformed CBS bracket or scheme, --profile of several runs, and an
    output file that cannot be written, are one line now; the qcschema module when the run reads
    or writes QCSchema."""
    from dfmp2.errors import InputError
    from dfmp2.workflows import cbs

    ck, resume = options.checkpoint, options.resume
    if profile and cbs.is_bracket(options.basis):
        raise InputError("--profile records one run; a basis bracket makes several: profile one basis", option="basis")
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
    if profile and qc and qc.is_qcschema_path(xyz_file):
        raise InputError("--profile records a run of an XYZ input, not of a QCSchema AtomicInput")
    return qc


def _compute(xyz_file, qcschema_path, qc, options, given, hooks, profile=False):
    """The run itself (a QCSchema input, a CBS bracket or one geometry): (the AtomicResult or
    None, the result). ``hooks``: progress, log and on_plan; ``profile``: --profile (one XYZ
    geometry). A failure with --qcschema writes its FailedOperation."""
    from dfmp2.interfaces import api
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows import cbs

    failures = qc.FailedOperationOnError(qcschema_path) if qc else contextlib.nullcontext()
    with terminate_raises(), failures:
        if qc and qc.is_qcschema_path(xyz_file):  # v1 or v2, run in process as run_qcschema does
            failures.input_data = qc.read_raw(xyz_file)
            return qc.run_atomic_input(failures.input_data, options, given=given, where=xyz_file, **hooks)
        geom = read_xyz(xyz_file)
        parts = qc.ScfEnergyParts() if qc else None
        if qc:
            failures.input_data = qc.input_from_run(geom, options)
        if cbs.is_bracket(options.basis):  # no qc here: --qcschema with a bracket is refused above
            result = cbs.run_cbs(geom, options, **hooks)
        else:
            result = api.run(geom, options, on_reference=parts, profile=profile, **hooks)
        atomic = qc.result_model(*qc.input_model(failures.input_data, xyz_file), result, parts.values) if qc else None
    return atomic, result


def _write_and_print(xyz_file, json_path, qcschema_path, qc, atomic, result, options, verbose, quiet, err):  # noqa: PLR0913
    """Rank 0: the files first (a stdout that fails, full or a reader gone, must not lose the
    result), then the table on stdout."""
    from dfmp2.errors import InputError
    from dfmp2.io.result import Result, cpu_blas_table

    ck = options.checkpoint
    qc_text = qc.to_json(atomic) if qcschema_path else None  # validated before any output
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
    console = stdout_console(json_path, qcschema_path)  # a document on stdout: the tables on stderr
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
    if not quiet:
        wrote(err, json_path, qcschema_path)


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
