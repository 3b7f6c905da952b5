"""``dfmp2 gradient``: the DF-MP2 energy and its nuclear gradient (Hartree/Bohr, per atom).

The energy run's table as ``dfmp2 run`` prints it, then the gradient of the chosen method's
energy (``--method mp2|scs-mp2|sos-mp2``, or a double hybrid of the table with its
``--dft-grid``: dfmp2.grad.dh) per atom, its largest component and its norm;
``--json`` writes the run's JSON with a 'gradient' section (units stated). Options: the shared
groups of ``dfmp2.cli.options`` (no checkpoint, one basis).
"""

from __future__ import annotations

import os

import click
from rich.markup import escape

from dfmp2.cli.options import (
    ShownChoice,
    blas_notices,
    check_stdin,
    device_options,
    json_option,
    molecule_options,
    printing,
    properties_options,
    resource_options,
    run_options,
    scf_options,
    shared_option,
    stderr_console,
    stdout_console,
    user_errors,
    wrote,
)
from dfmp2.cli.runtime import LazyProgress, terminate_raises
from dfmp2.io.outputs import check_output_file, is_stdout
from dfmp2.io.result import METHOD_SCALES as SCALES
from dfmp2.memory import human
from dfmp2.mp2.double_hybrids import FUNCTIONALS
from dfmp2.options import CONVERGENCE_SETS, SCF_DF_MODES, SCF_MODES

# what the gradient commands (gradient, optimize, frequencies) accept, in their --help: one basis, a
# density-fitted SCF, fp64 where the device has it, MP2's energies (the others parse, to be refused
# in one line with the reason: check_gradient_options)
POINT_CHANGES = {
    "molecule": {"basis": {"help": "orbital basis set (one basis; a bracket such as cc-pv[dt]z is dfmp2 run's)"}},
    "device": {
        "precision": {
            "help": "the gradient is computed in fp64, the derivative of the fp64 energy [default: fp64; fp32 only "
            "on a device without fp64 (trn: the RHF gradient, its pair loop in fp32)]"
        }
    },
    "scf": {
        "scf_mode": {
            "type": ShownChoice(SCF_DF_MODES, refused=[m for m in SCF_MODES if m not in SCF_DF_MODES]),
            "help": "the gradient needs a density-fitted SCF: df, ours with density fitting (JK-fit basis) "
            "on the device; pyscf-df, PySCF's DF-RHF/DF-UHF on the host (the cross-check)",
        }
    },
}


def gradient_table(gr):
    """The per-atom gradient (Eh/bohr) of a ``GradientResult`` as a rich table."""
    from rich.table import Table

    t = Table(title=f"nuclear gradient of E({gr.method.upper()}) / (Eh/bohr)", title_justify="left")
    for col in ("atom", "", "x", "y", "z"):
        t.add_column(col, justify="right" if col in ("x", "y", "z", "atom") else "left")
    for i, (sym, row) in enumerate(zip(gr.result.geometry["symbols"], gr.gradient)):
        t.add_row(str(i + 1), sym, *(f"{v:+.10f}" for v in row))
    g = gr.gradient
    t.caption = (
        f"E({gr.method.upper()}) = {gr.energy:.10f} Eh; max |g| {abs(g).max():.3e}, "
        f"rms {float((g**2).mean()) ** 0.5:.3e} Eh/bohr; Z-vector {gr.parts.zvector['iterations']} "
        f"iterations; gradient stage {gr.wall_s:.2f} s"
    )
    ran = gr.parts.ran
    plan = ran.get("plan")
    if plan:  # where its JK factor lived and the plan's peak against the limit
        home = {"memory": "in memory", "disk": "on disk", "split": "split over the ranks"}[plan["factor"]]
        limit = f" of {human(plan['limit_mb'])}" if plan.get("limit_mb") else ""
        t.caption += f"; memory plan {human(plan['peak_mb'])}{limit}, JK factor {home}"
    if "host_device" in ran:  # a device without fp64: the pair loop there, the rest on the host
        sim = ", simulated" if ran.get("simulated") else ""
        t.caption += (
            f"; pair loop on {ran['device']} (fp32{sim}), the rest on the host "
            f"{ran['host_device']} ({ran['host_precision']})"
        )
    return t


def point_inputs(method_help: str):
    """INPUT, the option groups shared with ``run`` (one basis, no checkpoint), ``--method`` and
    ``--dft-grid`` (a double hybrid's KS grid), for ``dfmp2 gradient``, ``optimize`` and
    ``frequencies``: --method offers MP2's methods and the table's functionals."""
    method_type = ShownChoice((*SCALES, *FUNCTIONALS), case_sensitive=False)

    def wrap(f):
        for deco in reversed(
            (
                click.argument("xyz_file", metavar="INPUT", type=click.Path(dir_okay=False)),
                molecule_options(**POINT_CHANGES["molecule"]),
                device_options(**POINT_CHANGES["device"]),
                scf_options(**POINT_CHANGES["scf"]),
                resource_options(),
                click.option("--method", type=method_type, default="mp2", show_default=True, help=method_help),
                shared_option("dft_grid"),
            )
        ):
            f = deco(f)
        return f

    return wrap


@click.command("gradient")
@point_inputs(
    "the energy differentiated: MP2, SCS-MP2 (1.2 OS + SS/3), SOS-MP2 (1.3 OS) or a double hybrid of the "
    "table (RKS or UKS; docs/double_hybrids.md)"
)
@properties_options(
    properties={
        "help": "also from the gradient's own relaxed densities (no extra work): dipole, the HF, unrelaxed "
        "and relaxed dipole moments of --method's energy in debye and e*bohr about the input's origin"
    }
)
@json_option("also write the result with the gradient (Eh/bohr) as JSON to this path ('-': standard output)")
@click.option("-q", "--quiet", is_flag=True, help="print only the energies and the gradient")
@click.option(
    "--profile",
    is_flag=True,
    help="also record where the time and bytes go, in the energy run and in the gradient stage (as dfmp2 "
    "run --profile): printed after the gradient and in --json's 'profile' and 'gradient.profile'",
)
@user_errors
def gradient_command(xyz_file, method, json_path, quiet, profile, **params):
    """The DF-MP2 energy of the molecule in INPUT (XYZ, Ångström) and its analytic nuclear
    gradient in Eh/bohr: RHF or UHF, density-fitted SCF, all-electron or frozen core."""
    from dfmp2 import distributed
    from dfmp2.drivers.gradient import run_gradient
    from dfmp2.io.xyz import read_xyz

    world = distributed.join(params["device"])  # torchrun: the energy and the gradient over the ranks
    with distributed.command(world):
        console = stdout_console(json_path)  # JSON on stdout: the tables on stderr
        err = stderr_console()
        options = run_options(params)
        check_stdin(xyz_file, world)
        if json_path is not None:  # before any work
            check_output_file(json_path, "--json", not_same_as=[("input", xyz_file)])
        quiet_here = quiet or bool(world.rank)  # rank 0 alone reports
        log = None if quiet_here else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
        progress = LazyProgress(err, "pair energies", enabled=not quiet_here)
        try:
            with terminate_raises():
                gr = run_gradient(
                    read_xyz(xyz_file), options, method=method, log=log, progress=progress, profile=profile
                )
        finally:
            progress.close()
        if world.rank:  # rank 0 alone writes and prints
            return
        if json_path:
            gr.write_json(json_path)
        with printing(written=(json_path,)):
            gr.result.render(console, quiet=quiet)
            console.print(gradient_table(gr))
            for w in gr.parts.warnings:
                console.print(f"[yellow]warning:[/yellow] {escape(w)}")
            if gr.profile:
                from dfmp2.io.result import profile_tables

                console.print("[bold]the gradient stage[/bold]")
                for table in profile_tables(gr.profile):
                    console.print(table)
        if not quiet:
            wrote(err, json_path)
        blas_notices(err, quiet)


@click.command("optimize")
@point_inputs(
    "the energy minimised: MP2, SCS-MP2, SOS-MP2 or a double hybrid of the table (RKS or UKS; docs/double_hybrids.md)"
)
@click.option(
    "-o",
    "--output",
    "final_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="the final geometry (XYZ, Å; '-': standard output, then name --trajectory) [default: INPUT's name "
    "with .opt.xyz, in the current directory; needed when INPUT is '-']",
)
@click.option(
    "--trajectory",
    "traj_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="every evaluated geometry (multi-frame XYZ) [default: beside the final geometry, its name with "
    ".traj.xyz for .opt.xyz or .xyz: -o out/w.xyz writes out/w.traj.xyz]",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="replace an existing file at a default output path (the final geometry's or the trajectory's); "
    "a path given with -o, --trajectory or --json is always replaced",
)
@click.option(
    "--max-steps",
    type=click.IntRange(min=1),
    default=100,
    show_default=True,
    help="energy and gradient evaluations before giving up",
)
@click.option(
    "--convergence",
    type=click.Choice(CONVERGENCE_SETS, case_sensitive=False),
    default="default",
    show_default=True,
    help="convergence criteria: geomeTRIC's named sets (gau_tight, gau_verytight, ...); default: GAU with "
    "max |g| 3e-4 and rms |g| 2e-4 Eh/bohr",
)
@json_option("also write the final result (energies, gradient, the steps) as JSON ('-': standard output)")
@click.option("-q", "--quiet", is_flag=True, help="print only the final energies and gradient")
@user_errors
def optimize_command(xyz_file, method, final_path, traj_path, max_steps, convergence, json_path, quiet, **params):
    """Optimise the geometry in INPUT (XYZ, Ångström) to a DF-MP2 minimum with geomeTRIC over
    the analytic gradient; writes the final XYZ and, beside it, the trajectory (also when it
    does not converge: then one error line and exit 2)."""
    from dfmp2 import distributed

    world = distributed.join(params["device"])  # torchrun: each step's energy and gradient over the ranks
    with distributed.command(world):
        _optimize(world, xyz_file, method, final_path, traj_path, max_steps, convergence, json_path, quiet, params)


def trajectory_beside(final_path: str) -> str:
    """The trajectory's default path: in the final geometry's directory, its name with .traj.xyz
    for .opt.xyz or .xyz (``out/w.xyz``, ``out/w.opt.xyz`` -> ``out/w.traj.xyz``), so that the
    two files of a run go where ``-o`` sends the result, never elsewhere."""
    from pathlib import Path

    final = Path(final_path)
    return str(final.with_name(final.name.removesuffix(".xyz").removesuffix(".opt") + ".traj.xyz"))


def _output_paths(xyz_file, final_path, traj_path, json_path, overwrite: bool) -> tuple[str, str]:
    """The final geometry's and the trajectory's paths, checked with --json before any work: none
    the input, none another output; a default path (from INPUT's name, or the trajectory beside
    -o) that exists is refused unless ``overwrite`` (an earlier run's result would be lost
    silently), while a path the user named is replaced, as -o and --json are everywhere. Standard
    input has no name to derive them from (-o needed), the trajectory is rewritten after every
    step (never standard output)."""
    from pathlib import Path

    from dfmp2.errors import InputError
    from dfmp2.io.xyz import STDIN

    if final_path is None and str(xyz_file) == STDIN:
        raise InputError(
            "INPUT -: standard input has no file name to name the outputs after; give -o (and --trajectory)"
        )
    if traj_path is None and final_path is not None and is_stdout(final_path):
        raise InputError(
            f"-o {final_path}: the final geometry goes to standard output; name the trajectory with --trajectory"
        )
    if traj_path is not None and is_stdout(traj_path):
        raise InputError(f"--trajectory {traj_path}: the trajectory is rewritten after every step; give it a file")
    defaults = set()
    if final_path is None:
        final_path = Path(xyz_file).name.removesuffix(".xyz") + ".opt.xyz"
        defaults.add("--output")
    if traj_path is None:
        traj_path = trajectory_beside(final_path)
        defaults.add("--trajectory")
    outs = ((final_path, "--output"), (traj_path, "--trajectory"), (json_path, "--json"))
    for path, what in outs:  # none the input, none another output (each would overwrite the other)
        if path is not None:
            others = [(f"{w} file", p) for p, w in outs if p is not None and w != what]
            check_output_file(path, what, not_same_as=[("input", xyz_file), *others])
            if what in defaults and not overwrite and os.path.lexists(path):
                raise InputError(
                    f"{path} exists (the default {what} path); name another with {what}, "
                    "or give --overwrite to replace it"
                )
    return final_path, traj_path


def _optimize(world, xyz_file, method, final_path, traj_path, max_steps, convergence, json_path, quiet, params):  # noqa: PLR0913
    """``optimize`` on this rank: every rank runs geomeTRIC over the same (bitwise) energies and
    gradients, so takes the same steps; rank 0 alone writes and prints. Not converged: the same
    OptimizationError on every rank, its one line from rank 0, the others exit 2 quietly."""
    from dfmp2.errors import EXIT_USER_ERROR
    from dfmp2.io.outputs import write_json
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows.optimize import OptimizationError, optimize

    lead = not world.rank
    err = stderr_console()
    overwrite = params.pop("overwrite", False)
    options = run_options(params)
    check_stdin(xyz_file, world)
    final_path, traj_path = _output_paths(xyz_file, final_path, traj_path, json_path, overwrite)
    console = stdout_console(final_path, json_path)  # a document on stdout: the tables on stderr
    quiet_here = quiet or not lead
    log = None if quiet_here else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    progress = LazyProgress(err, "pair energies", enabled=not quiet_here)
    try:
        with terminate_raises():
            out = optimize(
                read_xyz(xyz_file),
                options,
                method,
                trajectory=traj_path if lead else None,
                final=final_path if lead else None,
                max_steps=max_steps,
                convergence=convergence.lower(),
                log=log,
                progress=progress,
            )
    except OptimizationError as e:  # not converged: the steps so far in --json (converged false), then the line
        if not lead:
            raise SystemExit(EXIT_USER_ERROR) from None
        if json_path and e.result is not None and e.result.last is not None:
            write_json(json_path, e.result.to_dict(), indent=2)
        raise
    finally:
        progress.close()
    if not lead:
        return
    if json_path:
        write_json(json_path, out.to_dict(), indent=2)
    with printing(written=(final_path, traj_path, json_path)):
        out.last.result.render(console, quiet=quiet)
        console.print(gradient_table(out.last))
        final = "on standard output" if is_stdout(final_path) else final_path
        console.print(f"converged in {out.steps} steps; final geometry {final}, trajectory {traj_path}")
    blas_notices(err, quiet)
