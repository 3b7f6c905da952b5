"""``dfmp2 frequencies``: harmonic frequencies (cm⁻¹), normal modes, IR intensities (km/mol) and
ideal-gas thermochemistry by central differences of analytic gradients (DF-MP2's, a double hybrid's)
(dfmp2.workflows.frequencies). Tables on stdout; ``--json`` the whole record (Hessian, modes,
thermochemistry, units); ``--molden`` the normal modes for a viewer; ``--checkpoint`` resumes an
interrupted job. Under torchrun the evaluations are dealt to the ranks and rank 0 reports.
"""

from __future__ import annotations

import click
from rich.markup import escape
from rich.table import Table

from dfmp2.cli.gradient import point_inputs
from dfmp2.cli.options import (
    blas_notices,
    check_stdin,
    json_option,
    printing,
    run_options,
    stderr_console,
    stdout_console,
    user_errors,
)
from dfmp2.cli.runtime import LazyProgress, terminate_raises
from dfmp2.errors import InputError
from dfmp2.io.outputs import check_output_file, is_stdout

HARTREE_KCAL = 627.509474  # kcal/mol per Eh
HARTREE_KJ = 2625.499639  # kJ/mol per Eh


def frequency_table(res) -> Table:
    t = Table(
        title=f"harmonic frequencies of E({res.method.upper()}); μ reduced mass, k force constant", title_justify="left"
    )
    for col in ("mode", "ν (cm⁻¹)", "μ (amu)", "k (mdyn/Å)", "IR (km/mol)"):
        t.add_column(col, justify="right")
    ir = res.ir if res.ir is not None else [None] * len(res.frequencies)
    for m, (f, mu, k, i) in enumerate(zip(res.frequencies, res.reduced_masses, res.force_constants, ir)):
        nu = f"{-f:.2f}i" if f < 0 else f"{f:.2f}"
        t.add_row(str(m + 1), nu, f"{mu:.4f}", f"{k:.4f}", "—" if i is None else f"{i:.2f}")
    fd = res.tasks
    t.caption = (
        f"E({res.method.upper()}) = {res.energy:.10f} Eh at the input geometry, max |g| "
        f"{abs(res.gradient).max():.2e} Eh/bohr; Hessian by central differences of analytic gradients, "
        f"step {res.step:g} bohr, {fd['evaluations']} evaluations ({fd['resumed']} from the checkpoint) "
        f"over {fd['ranks']} rank(s); "
        + (
            "a linear molecule: 3 translations and 2 rotations projected out, 3N − 5 modes"
            if res.linear
            else "translations and rotations projected out"
        )
        + " (PySCF's harmonic_analysis)"
        + ("" if res.ir is not None else "; no IR intensities (--no-ir)")
    )
    return t


def thermo_table(res) -> Table:
    th = res.thermo
    T, p = th["temperature"][0], th["pressure"][0]
    t = Table(title=f"ideal gas, rigid rotor, harmonic oscillator: T = {T:g} K, p = {p:g} Pa", title_justify="left")
    for col in ("quantity", "Eh", "kcal/mol", "kJ/mol"):
        t.add_column(col, justify="right" if col != "quantity" else "left")
    for key, name in (
        ("ZPE", "zero-point energy"),
        ("E_0K", "E0 + ZPE"),
        ("E_tot", "U(T)"),
        ("H_tot", "H(T)"),
        ("G_tot", "G(T)"),
    ):
        v = float(th[key][0])
        t.add_row(name, f"{v:.8f}", f"{v * HARTREE_KCAL:.3f}", f"{v * HARTREE_KJ:.3f}")
    s = float(th["S_tot"][0])
    t.add_row(
        "S(T) (per K)", f"{s:.6e}", f"{s * HARTREE_KCAL * 1e3:.3f} cal/(mol K)", f"{s * HARTREE_KJ * 1e3:.3f} J/(mol K)"
    )
    sym = res.symmetry
    how = "given" if sym.get("source") == "given" else f"PySCF's detect_symm at {sym.get('tolerance_bohr', 0):g} bohr"
    t.caption = (
        f"point group {res.point_group}, rotational symmetry number {th['sym_number'][0]:g} ({how}; "
        "--symmetry-number to set it); PySCF's hessian.thermo; imaginary modes left out of the vibrational sums"
    )
    return t


@click.command("frequencies")
@point_inputs(
    "the energy differentiated twice: MP2, SCS-MP2, SOS-MP2 or a double hybrid of the table (RKS or UKS; "
    "docs/double_hybrids.md)"
)
@click.option("--step", type=float, default=0.005, show_default=True, help="central-difference step, bohr")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=298.15, show_default=True, help="K")
@click.option("--pressure", type=click.FloatRange(min=0, min_open=True), default=101325.0, show_default=True, help="Pa")
@click.option(
    "--checkpoint",
    "ck_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="a JSON file of the finished evaluations, rewritten after each round; given again for the same "
    "molecule and options, the job resumes from it",
)
@json_option("the whole record as JSON ('-': standard output)")
@click.option(
    "--molden",
    "molden_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="normal modes (Molden; '-': standard output)",
)
@click.option(
    "--ir/--no-ir",
    default=True,
    show_default=True,
    help="IR intensities from the relaxed dipole (MP2's or the double hybrid's) at every displacement (the "
    "gradient's own relaxed density)",
)
@click.option(
    "--symmetry-number",
    type=click.IntRange(min=1),
    default=None,
    help="the rotational symmetry number σ of the thermochemistry [default: that of the point group PySCF's "
    "detect_symm finds at 0.01 bohr, loose enough for an optimised geometry]",
)
@click.option("-q", "--quiet", is_flag=True, help="print only the tables")
@user_errors
def frequencies_command(  # noqa: PLR0913
    xyz_file, method, step, temperature, pressure, ck_path, json_path, molden_path, ir, symmetry_number, quiet, **params
):
    """Harmonic frequencies, normal modes, IR intensities and thermochemistry of the molecule in
    INPUT (XYZ, Ångström) at its geometry (optimise it first: dfmp2 optimize), from central
    differences of analytic DF-MP2 gradients (6N + 1 of them)."""

    from dfmp2 import distributed
    from dfmp2.io.outputs import write_json, write_text
    from dfmp2.io.xyz import read_xyz
    from dfmp2.workflows.frequencies import frequencies, molden_text

    world = distributed.join(params["device"])
    with distributed.command(world):
        console, err = stdout_console(json_path, molden_path), stderr_console()  # -: tables to stderr
        options = run_options(params)
        check_stdin(xyz_file, world)
        if ck_path is not None and is_stdout(ck_path):
            raise InputError(f"--checkpoint {ck_path}: the checkpoint is rewritten and read back; give it a file")
        outs = ((json_path, "--json"), (molden_path, "--molden"), (ck_path, "--checkpoint"))
        for path, what in outs:
            if path is not None:
                others = [("input", xyz_file)] + [(w, p) for p, w in outs if p is not None and w != what]
                check_output_file(path, what, not_same_as=others)
        log = None if quiet or world.rank else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
        progress = LazyProgress(err, "pair energies", enabled=not quiet and not world.rank)
        try:
            with terminate_raises():
                res = frequencies(
                    read_xyz(xyz_file),
                    options,
                    method,
                    step=step,
                    temperature=temperature,
                    pressure=pressure,
                    checkpoint=ck_path,
                    ir=ir,
                    symmetry_number=symmetry_number,
                    log=log,
                    progress=progress,
                )
        finally:
            progress.close()
        if world.rank:  # rank 0 alone writes and prints
            return
        if json_path:
            write_json(json_path, res.to_dict(), indent=2)
        if molden_path:
            write_text(molden_path, molden_text(res))
        with printing(written=(json_path, molden_path)):
            console.print(frequency_table(res))
            console.print(thermo_table(res))
            for w in res.warnings:
                console.print(f"[yellow]warning:[/yellow] {escape(w)}")
        blas_notices(err, quiet)
