"""The ``dfmp2`` command line (click). User mistakes print one ``error:`` line and exit 2."""
from __future__ import annotations

import contextlib
import functools
import math
import signal
import sys
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from linalg import DeviceUnavailableError, KernelError
from linalg.cuda import AUTO_RULE, PAIR_KERNELS

from .errors import InputError, error_line
from .outputs import check_output_file, write_text

DEVICE_CHOICES = ("cpu", "cuda", "cuda:N", "trn1", "trn2")
PAIR_KERNEL_HELP = f"cuda only: the MP2 pair-step path; auto: {AUTO_RULE} (the result's 'ran' says which ran and why)"
INTEGRALS_HELP = ("3-center integral engine: host (libcint in a background thread, overlapping the device "
                  "work) or gpu4pyscf (CUDA kernels; pip install -e '.[cuda13]'); auto: gpu4pyscf when it "
                  "is importable and the device is cuda, else host")
INTEGRAL_ENGINES = ("auto", "host", "gpu4pyscf")     # dfmp2.integrals.ENGINES (not imported: PySCF is slow to import)
EXIT_USER_ERROR = 2


def user_errors(fn):
    """Turn expected failures into one line on stderr and exit code 2 (no traceback)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, DeviceUnavailableError, KernelError) as e:
            click.echo(f"error: {error_line(e)}", err=True)
            sys.exit(EXIT_USER_ERROR)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
    return wrapper


# The SCF choice of every command that runs molecules (dfmp2.scf.SCF_MODES; a test holds them equal)
scf_option = click.option(
    "--scf", "scf_mode", type=click.Choice(["df", "pyscf-df", "exact"]), default="df", show_default=True,
    help="RHF: df, ours with density fitting (JK-fit basis) on --device; pyscf-df, PySCF's DF-RHF on "
         "the host (the cross-check); exact, PySCF's RHF with exact integrals. Open shells: PySCF's "
         "DF-UHF (df, pyscf-df) or UHF (exact)")


class _LazyProgress:
    """A rich progress bar that appears only once the work has run longer than ``after`` s."""

    def __init__(self, console, label: str, after: float = 2.0, enabled: bool = True):
        self.console, self.label, self.after, self.enabled = console, label, after, enabled
        self.t0, self.bar, self.task = time.perf_counter(), None, None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            if time.perf_counter() - self.t0 < self.after or done >= total:
                return
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress,
                                       TimeElapsedColumn, TimeRemainingColumn)
            self.bar = Progress("[progress.description]{task.description}", BarColumn(),
                                MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn(),
                                console=self.console, transient=True)
            self.bar.start()
            self.task = self.bar.add_task(self.label, total=total)
        self.bar.update(self.task, completed=done)
        if done >= total:
            self.close()

    def close(self):
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def parse_memory(value: str | None) -> float | None:
    """'4000', '4000MB', '4GB', '512MiB' -> MB (10^6 bytes)."""
    if value is None:
        return None
    s = value.strip().upper().replace(" ", "")
    units = {"GIB": 1024**3 / 1e6, "MIB": 1024**2 / 1e6, "GB": 1e3, "MB": 1.0, "G": 1e3, "M": 1.0}
    for u, f in units.items():
        if s.endswith(u):
            s, factor = s[: -len(u)], f
            break
    else:
        factor = 1.0
    try:
        if "_" in s:                  # float() would read '4_000' as 4000
            raise ValueError
        mb = float(s) * factor
    except ValueError:
        raise InputError(f"--memory: cannot read '{value}'; give e.g. 4000MB or 4GB") from None
    if not math.isfinite(mb):         # 'nan', 'inf' and '1e400' all parse as floats
        raise InputError(f"--memory must be a finite size, got '{value}'; give e.g. 4000MB or 4GB")
    if mb <= 0:
        raise InputError(f"--memory must be positive, got '{value}'")
    return mb


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
        except click.exceptions.NoArgsIsHelpError as e:     # bare 'dfmp2': the help, as click does
            e.show()
            sys.exit(e.exit_code)
        except click.ClickException as e:
            msg = " ".join(e.format_message().split())
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                msg += f" (see '{ctx.command_path} --help')"
            click.echo(f"error: {msg}", err=True)
            sys.exit(e.exit_code)
        except click.Abort:                                   # Ctrl-C or EOF outside a command
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        # non-standalone click returns the exit code of --help/--version (ctx.exit) and the
        # command's return value otherwise (None for every dfmp2 command)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=OneLineErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dfmp2")
def main():
    """DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium."""


@contextlib.contextmanager
def _terminate_raises():
    """While the run goes on, SIGTERM and SIGHUP raise KeyboardInterrupt in the main thread (as
    Ctrl-C does), so every ``finally`` runs: temporary files are removed, a checkpoint is closed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)
    sigs = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None]
    old = {s: signal.signal(s, raise_interrupt) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


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
        "fit": "L, " + ("read-ahead column blocks, queued writes" if plan.out_of_core
                        else "(P|ia) becoming B block by block"),
        "pair": ("Bi, Bj and read-ahead blocks" if plan.out_of_core else "B") + ", pair workspace",
    }
    for stage, mb in plan.stages_mb.items():
        t.add_row(stage, f"{mb:,.1f}", what.get(stage, ""))
    t.add_section()
    t.add_row("peak", f"{plan.peak_mb:,.1f}", f"limit {plan.limit_mb:,.1f} MB")
    t.add_row("B", f"{plan.b_mb:,.1f}",
              f"on disk (HDF5), {plan.disk_mb:,.1f} MB of disk" if plan.out_of_core
              else "in memory")
    t.add_row("in memory would need", f"{plan.in_memory_mb:,.1f}", "")
    if plan.integrals.get("host_mb"):
        t.add_row("integral buffers", f"{plan.integrals['host_mb']:,.1f}",
                  f"host memory (pinned), outside the plan: {plan.integrals['queue_depth']} packed blocks")
    t.add_row("smallest feasible", f"{plan.min_mb:,.1f}", "B on disk, smallest blocks"
              if plan.storage != "memory" else "B in memory, smallest blocks")
    t.caption = (f"blocks: {plan.aux_block} auxiliary functions per (μν|P) block, "
                 f"{plan.occ_block} occupied orbitals per fit / pair block; storage {plan.storage}")
    return t


@main.command()
@click.argument("xyz_file", metavar="INPUT", type=click.Path(dir_okay=False))
@click.option("--basis", default="cc-pvdz", show_default=True, help="orbital basis set")
@click.option("--auxbasis", default=None,
              help="MP2 fitting basis [default: the MP2-fit set matched to --basis, e.g. cc-pvdz-ri; def2-tzvpp-ri (to Kr) or AutoAux for elements it lacks, stated in the output]")
@click.option("--charge", type=int, default=None, help="molecular charge [default: XYZ comment, else 0]")
@click.option("--multiplicity", type=int, default=None,
              help="spin multiplicity 2S+1 [default: XYZ comment, else 1]")
@click.option("--reference", type=click.Choice(["auto", "rhf", "uhf", "rohf"]), default="auto",
              show_default=True,
              help="SCF reference: auto is RHF for a closed shell, UHF (DF-UMP2) otherwise; rohf is not supported")
@click.option("--device", default="cpu", show_default=True, metavar="|".join(DEVICE_CHOICES),
              help="where the linear algebra runs")
@click.option("--simulate", is_flag=True,
              help="trn1/trn2 only: run the NKI kernels on this CPU (nki.simulate or dfmp2's NumPy execution)")
@click.option("--precision", type=click.Choice(["fp64", "fp32"]), default=None,
              help="working precision of the GEMMs; energies are summed in fp64 [default: fp64, fp32 on trn]")
@click.option("--pair-kernel", type=click.Choice(PAIR_KERNELS), default="auto", show_default=True,
              help=PAIR_KERNEL_HELP)
@click.option("--integrals", type=click.Choice(INTEGRAL_ENGINES), default="auto", show_default=True,
              help=INTEGRALS_HELP)
@click.option("--frozen-core/--all-electron", default=False, show_default=True,
              help="freeze the chemical core orbitals in MP2")
@click.option("--ecp", type=click.Choice(["auto", "none"]), default="auto", show_default=True,
              help="auto: the effective core potential the basis comes with (def2-* beyond Kr, *-pp, LANL2DZ), stated in the output; none: all-electron (warned for a basis made for an ECP)")
@scf_option
@click.option("--memory", default=None, help="memory limit, e.g. 8GB [default: 80% of available]")
@click.option("--storage", type=click.Choice(["auto", "memory", "disk"]), default="auto", show_default=True,
              help="where B lives: in memory if the plan fits, else on disk (auto), or forced")
@click.option("--scratch", "scratch_dir", type=click.Path(file_okay=False), default=None,
              help="directory for out-of-core files, removed when the run ends [default: $TMPDIR or /tmp]")
@click.option("--checkpoint", "checkpoint_path", type=click.Path(dir_okay=False), default=None,
              help="write a checkpoint (HDF5: SCF, B, finished pair blocks) to this new file as the run goes")
@click.option("--resume", "resume_path", type=click.Path(dir_okay=False), default=None,
              help="continue the interrupted run in this checkpoint (same molecule and options)")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write the result as JSON to this path")
@click.option("--qcschema", "qcschema_path", type=click.Path(dir_okay=False), default=None,
              help="also write a QCSchema AtomicResult to this path (a FailedOperation when the run fails); needs qcelemental")
# tuning (tests, benchmarks), not in --help: RunOptions' defaults when not given
@click.option("--occ-block-max", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--j3c-block-mb", type=click.FloatRange(min=0, min_open=True), default=None, hidden=True)
@click.option("--scf-max-cycle", type=click.IntRange(min=1), default=None,
              help="most SCF iterations; a run whose SCF has not converged by then stops [default: 100]; raise it for a slowly converging open shell")
@click.option("-v", "--verbose", is_flag=True, help="print the memory plan (stages, blocks, where B lives)")
@click.option("-q", "--quiet", is_flag=True, help="print only the energies table")
@user_errors
def run(xyz_file, basis, auxbasis, charge, multiplicity, reference, device, simulate, precision, pair_kernel,
        integrals, frozen_core, ecp, scf_mode, memory, storage, scratch_dir, checkpoint_path, resume_path,
        json_path, qcschema_path, verbose, quiet, **tuning):
    """Compute the DF-MP2 energy of the molecule in INPUT: an XYZ file (coordinates in Ångström)
    or a QCSchema AtomicInput (*.json: molecule in Bohr, model mp2 and basis, keywords)."""
    from .pipeline import RunOptions, run_geometry
    from .xyz import read_xyz

    console = Console()
    err = Console(stderr=True)
    options = RunOptions(basis=basis, auxbasis=auxbasis, charge=charge, multiplicity=multiplicity,
                         reference=reference, device=device, simulate=simulate, precision=precision,
                         frozen_core=frozen_core, ecp=ecp, scf_mode=scf_mode, memory_mb=parse_memory(memory),
                         storage=storage, scratch_dir=scratch_dir, checkpoint=checkpoint_path,
                         resume=resume_path, pair_kernel=pair_kernel, integrals=integrals,
                         **{k: v for k, v in tuning.items() if v is not None})
    if json_path:       # before any work: a JSON that cannot be written fails now, not after the run
        check_output_file(json_path, "--json", not_same_as=[
            ("input", xyz_file), ("checkpoint", checkpoint_path), ("checkpoint", resume_path)])
    qc = _qcschema_path(xyz_file, qcschema_path, json_path, checkpoint_path, resume_path)
    ctx = click.get_current_context()
    given = {"memory_mb" if p == "memory" else p for p in ctx.params
             if ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE}
    failures = qc.FailedOperationOnError(qcschema_path) if qc else contextlib.nullcontext()
    progress = _LazyProgress(err, "pair energies", enabled=not quiet)
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    on_plan = (lambda plan: err.print(_plan_table(plan))) if verbose else None
    try:
        with _terminate_raises(), failures:
            if qc and qc.is_qcschema_path(xyz_file):
                failures.input_data = qc.read_raw(xyz_file)
                inp, geom, options = qc.parse_input(failures.input_data, xyz_file, options, given)
                inp = failures.input_data
            else:
                geom = read_xyz(xyz_file)
                inp = qc.input_from_run(geom, options) if qc else None
                if qc:
                    failures.input_data = inp
            result = run_geometry(geom, options, progress=progress, log=log, on_plan=on_plan)
    except KeyboardInterrupt:
        progress.close()
        ck = resume_path or checkpoint_path
        # a checkpoint that held nothing to resume was removed (pipeline.run_geometry)
        hint = f"; continue with: dfmp2 run {xyz_file} ... --resume {ck}" if ck and Path(ck).exists() else ""
        click.echo(f"error: interrupted{hint}", err=True)
        sys.exit(130)
    finally:
        progress.close()
    qc_text = qc.atomic_result(inp, result) if qcschema_path else None   # validated before any output
    result.render(console, quiet=quiet)
    if json_path:
        result.write_json(json_path)
        if not quiet:
            err.print(f"[dim]wrote {escape(str(json_path))}[/dim]")
    if qcschema_path:
        write_text(qcschema_path, qc_text)
        if not quiet:
            err.print(f"[dim]wrote {escape(str(qcschema_path))}[/dim]")


def _qcschema_path(input_path, qcschema_path, *others):
    """The qcschema module when the run reads or writes QCSchema (qcelemental checked now, before
    any work), else None; ``--qcschema`` is checked like ``--json``."""
    from . import qcschema
    if not (qcschema_path or qcschema.is_qcschema_path(input_path)):
        return None
    qcschema.models()
    if qcschema_path:
        json_path, ck, resume = others
        check_output_file(qcschema_path, "--qcschema", not_same_as=[
            ("input", input_path), ("--json", json_path), ("checkpoint", ck), ("checkpoint", resume)])
    return qcschema


@main.command()
@click.argument("xyz_file", type=click.Path(dir_okay=False))
@click.option("--fragments", default=None, metavar="1-3,4-6",
              help="atoms of each fragment, 1-based; commas separate fragments, '+' joins parts of "
                   "one (1-3+7,4-6) [default: the '--' lines of the XYZ file]")
@click.option("--fragment-charges", default=None, metavar="0,0",
              help="charge of each fragment; they must add up to the total charge [default: the "
                   "XYZ's 'charge multiplicity' fragment lines, else 0 each]")
@click.option("--fragment-multiplicities", default=None, metavar="1,1",
              help="multiplicity (2S+1) of each fragment [default: the XYZ's fragment lines, else 1 each]")
@click.option("--charge", type=int, default=None,
              help="total charge [default: XYZ comment, else the sum of --fragment-charges]")
@click.option("--multiplicity", type=int, default=None,
              help="total multiplicity [default: XYZ comment, else the fragments' high-spin coupling]")
@click.option("--basis", default="cc-pvdz", show_default=True, help="orbital basis set")
@click.option("--auxbasis", default=None, help="MP2 fitting basis [default: the MP2-fit set matched to --basis]")
@click.option("--device", default="cpu", show_default=True, metavar="|".join(DEVICE_CHOICES),
              help="where the linear algebra of every run goes")
@click.option("--simulate", is_flag=True, help="trn1/trn2 only: run the NKI kernels on this CPU")
@click.option("--precision", type=click.Choice(["fp64", "fp32"]), default=None,
              help="working precision of the GEMMs [default: fp64, fp32 on trn]")
@click.option("--pair-kernel", type=click.Choice(PAIR_KERNELS), default="auto", show_default=True,
              help=PAIR_KERNEL_HELP)
@click.option("--frozen-core/--all-electron", default=False, show_default=True,
              help="freeze the chemical core orbitals in MP2 (ghost atoms have none)")
@scf_option
@click.option("--memory", default=None, help="memory limit per run, e.g. 8GB [default: 80% of available]")
@click.option("--storage", type=click.Choice(["auto", "memory", "disk"]), default="auto", show_default=True,
              help="where B lives in each run")
@click.option("--scratch", "scratch_dir", type=click.Path(file_okay=False), default=None,
              help="directory for out-of-core files [default: $TMPDIR or /tmp]")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="also write the interaction energies, every run's energies and what ran as JSON")
@click.option("-q", "--quiet", is_flag=True, help="print only the interaction energies")
@user_errors
def interaction(xyz_file, fragments, fragment_charges, fragment_multiplicities, charge, multiplicity,
                basis, auxbasis, device, simulate, precision, pair_kernel, frozen_core, scf_mode,
                memory, storage, scratch_dir, json_path, quiet):
    """Interaction energy of the fragments in XYZ_FILE (Ångström), counterpoise-corrected and not.

    Runs DF-MP2 on the full system, on each fragment in the full basis (the other atoms as ghost
    atoms with their orbital and fitting basis sets) and on each fragment in its own basis, all
    on one device; prints ΔE(HF), ΔE(MP2), ΔE(SCS-MP2) in Eh and kcal/mol.
    """
    from .interaction import resolve_fragments, run_interaction
    from .pipeline import RunOptions
    from .xyz import read_xyz

    console = Console()
    if not console.is_terminal:      # files and pipes get the whole table
        console = Console(width=120)
    err = Console(stderr=True)
    geom = read_xyz(xyz_file)
    frags = resolve_fragments(geom, fragments, fragment_charges, fragment_multiplicities,
                              charge, multiplicity)
    options = RunOptions(basis=basis, auxbasis=auxbasis, device=device, simulate=simulate,
                         precision=precision, frozen_core=frozen_core, scf_mode=scf_mode,
                         memory_mb=parse_memory(memory), storage=storage, scratch_dir=scratch_dir,
                         pair_kernel=pair_kernel)
    if json_path:       # before any work
        check_output_file(json_path, "--json", not_same_as=[("input", xyz_file)])
    progress = _LazyProgress(err, "pair energies", enabled=not quiet)
    log = None if quiet else (lambda msg: err.print(f"[dim]{escape(msg)}[/dim]"))
    try:
        with _terminate_raises():
            result = run_interaction(geom, frags, options, log=log, progress=progress)
    finally:
        progress.close()
    result.render(console, quiet=quiet)
    if json_path:
        result.write_json(json_path)
        if not quiet:
            err.print(f"[dim]wrote {escape(str(json_path))}[/dim]")


from .regress import regress_command  # noqa: E402
main.add_command(regress_command, "regress")

from .compare import compare_command  # noqa: E402
main.add_command(compare_command, "compare")

from .bench import bench_command  # noqa: E402
main.add_command(bench_command, "bench")


if __name__ == "__main__":
    main()
