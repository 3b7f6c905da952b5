"""``dfmp2 gradient``: the DF-MP2 energy and its nuclear gradient (Hartree/Bohr, per atom).

The energy run's table as ``dfmp2 run`` prints it, then the gradient of the chosen method's
energy (``--method mp2|scs-mp2|sos-mp2``) per atom, its largest component and its norm;
``--json`` writes the run's JSON with a 'gradient' section (units stated). Options: the shared
groups of ``dfmp2.cli_options`` (no checkpoint, one basis).
"""
from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from .cli_options import (device_options, molecule_options, printing, resource_options, run_options,
                          scf_options, stdout_console, user_errors)
from .mp2grad import SCALES
from .outputs import check_output_file


def gradient_table(gr):
    """The per-atom gradient (Eh/bohr) of a gradrun.GradientResult as a rich table."""
    from rich.table import Table
    t = Table(title=f"nuclear gradient of E({gr.method.upper()}) / (Eh/bohr)", title_justify="left")
    for col in ("atom", "", "x", "y", "z"):
        t.add_column(col, justify="right" if col in ("x", "y", "z", "atom") else "left")
    for i, (sym, row) in enumerate(zip(gr.result.geometry["symbols"], gr.gradient)):
        t.add_row(str(i + 1), sym, *(f"{v:+.10f}" for v in row))
    g = gr.gradient
    t.caption = (f"E({gr.method.upper()}) = {gr.energy:.10f} Eh; max |g| {abs(g).max():.3e}, "
                 f"rms {float((g ** 2).mean()) ** 0.5:.3e} Eh/bohr; Z-vector {gr.parts.zvector['iterations']} "
                 f"iterations; gradient stage {gr.wall_s:.2f} s")
    return t


@click.command("gradient")
@click.argument("xyz_file", metavar="INPUT", type=click.Path(dir_okay=False))
@molecule_options()
@device_options()
@scf_options()
@resource_options()
@click.option("--method", type=click.Choice(tuple(SCALES)), default="mp2", show_default=True,
              help="the energy differentiated: MP2, SCS-MP2 (1.2 OS + SS/3) or SOS-MP2 (1.3 OS)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write the result with the gradient (Eh/bohr) as JSON to this path")
@click.option("-q", "--quiet", is_flag=True, help="print only the energies and the gradient")
@user_errors
def gradient_command(xyz_file, method, json_path, quiet, **params):
    """The DF-MP2 energy of the molecule in INPUT (XYZ, Ångström) and its analytic nuclear
    gradient in Eh/bohr: closed-shell RHF, density-fitted SCF, all-electron or frozen core."""
    from .gradrun import run_gradient
    from .xyz import read_xyz

    console = stdout_console()
    err = Console(stderr=True)
    options = run_options(params)
    if json_path is not None:       # before any work
        check_output_file(json_path, "--json", not_same_as=[("input", xyz_file)])
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    gr = run_gradient(read_xyz(xyz_file), options, method=method, log=log)
    if json_path:
        gr.write_json(json_path)
    with printing(written=(json_path,)):
        gr.result.render(console, quiet=quiet)
        console.print(gradient_table(gr))
        for w in gr.parts.warnings:
            console.print(f"[yellow]warning:[/yellow] {escape(w)}")
    if json_path and not quiet:
        err.print(f"[dim]wrote {escape(str(json_path))}[/dim]")
