"""``dfmp2 interaction``: the counterpoise-corrected and uncorrected interaction energy of the
fragments of one XYZ file (dfmp2.workflows.interaction), its runs dealt over torchrun's ranks."""

from __future__ import annotations

import click
from rich.markup import escape

from dfmp2.cli.options import (
    blas_notices,
    cbs_options,
    check_stdin,
    device_options,
    json_option,
    molecule_options,
    printing,
    resource_options,
    run_options,
    scf_options,
    stderr_console,
    stdout_console,
    user_errors,
    wrote,
)
from dfmp2.cli.runtime import LazyProgress, terminate_raises
from dfmp2.io.outputs import check_output_file


@click.command("interaction")
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
@json_option("also write the interaction energies, every run's energies and what ran as JSON ('-': standard output)")
@click.option("-q", "--quiet", is_flag=True, help="print only the interaction energies")
@user_errors
def interaction_command(xyz_file, fragments, fragment_charges, fragment_multiplicities, json_path, quiet, **params):
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

    console = stdout_console(json_path)  # JSON on stdout: the tables on stderr
    err = stderr_console()
    with world.agreeing():  # a refusal on one rank ends every rank, before any work
        check_stdin(xyz_file, world)
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
    if not quiet:
        wrote(err, json_path)
    blas_notices(err, quiet)
