"""The options the commands share, defined once, and every command's error handling.

Groups (click decorators; the choices come from dfmp2.options, the flags from
dfmp2.errors.flag, the defaults from RunOptions):

    @molecule_options()    --basis --auxbasis --charge --multiplicity --reference --ecp --frozen-core
    @device_options()      --device --simulate --precision --pair-kernel --integrals --cpu-blas
    @scf_options()         --scf --scf-max-cycle --scf-conv-tol-grad --scf-precision --scf-stability
    @resource_options()    --memory --storage --scratch (and the hidden tuning --occ-block-max,
                           --j3c-block-mb)
    @checkpoint_options()  --checkpoint --resume
    @cbs_options()         --cbs-scf (with a basis bracket, --basis cc-pv[dt]z: dfmp2.workflows.cbs)
    @properties_options()  --properties (after the energy: dfmp2.props)

Every param is named after its RunOptions field (``--memory`` -> memory_mb, ``--scf`` ->
scf_mode), so ``run_options(params)`` takes exactly the fields a command offers. A command leaves
a field out with ``skip=(field, ...)`` and changes what differs for it with ``field={...}``
(click.option keywords: its help, its default). ``user_errors`` is every command's handler.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import math
import os
import sys

import click
from rich.console import Console

from dfmp2.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, InputError, Terminated, error_line, flag, one_line
from dfmp2.linalg import DeviceUnavailableError, KernelError
from dfmp2.linalg.cpu_pair import AUTO_RULE as CPU_AUTO_RULE
from dfmp2.linalg.cuda import AUTO_RULE
from dfmp2.options import (
    CBS_SCF_SCHEMES,
    CPU_BLAS_CHOICES,
    DEVICE_CHOICES,
    DIST_SCF_MODES,
    ECP_CHOICES,
    INTEGRAL_ENGINES,
    METHODS,
    PAIR_KERNEL_CHOICES,
    PRECISIONS,
    PROPERTY_CHOICES,
    REFERENCES,
    SCF_MODES,
    SCF_PRECISIONS,
    SCF_SCREEN_MAX,
    STORAGE_CHOICES,
    RunOptions,
)

_DEFAULT = RunOptions()
RUN_FIELDS = tuple(f.name for f in dataclasses.fields(RunOptions))


class ShownChoice(click.Choice):
    """A click.Choice whose --help, error message and shell completion offer only ``shown`` (what
    the command accepts); the names in ``refused`` still parse, so that the command's own check
    refuses them with its reason in one error line (a double hybrid's gradient, --scf exact)."""

    def __init__(self, shown, refused=(), case_sensitive: bool = True):
        super().__init__(tuple(shown), case_sensitive)
        self.refused = tuple(refused)

    def convert(self, value, param, ctx):
        fold = (lambda v: v) if self.case_sensitive else (lambda v: str(v).casefold())
        for name in self.refused:
            if fold(value) == fold(name):
                return name
        return super().convert(value, param, ctx)


def json_option(help: str):
    """The ``--json PATH`` option (``json_path``) of a command that writes its document there."""
    return click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None, help=help)


# click.option keywords of each shared option (besides its flag, name and default)
SPECS = {
    "basis": dict(
        help="orbital basis set; per element as 'O:cc-pvdz,H:sto-3g' ('default:NAME' for the "
        "elements not named; each element's fitting sets are stated in the output); a bracket of "
        "consecutive zeta levels (cc-pv[dt]z, aug-cc-pv[tq]z, "
        "def2-[tq]zvp) runs each basis and extrapolates to the basis-set limit as Psi4's cbs() "
        "does: correlation energy by Helgaker's X^-3 two-point formula, SCF at the largest basis "
        "(or --cbs-scf)"
    ),
    "auxbasis": dict(
        help="MP2 fitting basis [default: the MP2-fit set matched to --basis, e.g. cc-pvdz-ri; "
        "def2-tzvpp-ri (to Kr) or AutoAux for elements it lacks, stated in the output]"
    ),
    "charge": dict(type=int, help="molecular charge [default: XYZ comment, else 0]"),
    "multiplicity": dict(type=int, help="spin multiplicity 2S+1 [default: XYZ comment, else 1]"),
    "reference": dict(
        type=ShownChoice([r for r in REFERENCES if r != "rohf"], refused=("rohf",)),
        help="SCF reference: auto is RHF for a closed shell, UHF (DF-UMP2) otherwise (ROHF is not supported)",
    ),
    "ecp": dict(
        type=click.Choice(ECP_CHOICES),
        help="auto: the effective core potential the basis comes with (def2-* beyond Kr, *-pp, "
        "LANL2DZ), stated in the output; none: all-electron, refused for a basis made for an "
        "ECP; none-for-testing: such a basis all-electron all the same, warned",
    ),
    "frozen_core": dict(help="freeze the chemical core orbitals in MP2"),
    "device": dict(metavar="|".join(DEVICE_CHOICES), help="where the linear algebra runs"),
    "simulate": dict(
        is_flag=True, help="trn1/trn2 only: run the NKI kernels on this CPU (nki.simulate or dfmp2's NumPy execution)"
    ),
    "precision": dict(
        type=click.Choice(PRECISIONS),
        help="working precision of the GEMMs; energies are summed in fp64 [default: fp64, fp32 on trn]",
    ),
    "pair_kernel": dict(
        type=click.Choice(PAIR_KERNEL_CHOICES),
        help=f"the MP2 pair-step path. cuda: gemm+epilogue or fused, auto: {AUTO_RULE}; cpu: "
        f"gemm+epilogue or gemm+torch, auto: {CPU_AUTO_RULE} (the result's 'ran' says "
        "which ran and why)",
    ),
    "integrals": dict(
        type=click.Choice(INTEGRAL_ENGINES),
        help="3-center integral engine: host (libcint in a background thread, overlapping the "
        "device work) or gpu4pyscf (CUDA kernels; pip install -e '.[cuda13]'); auto: "
        "gpu4pyscf when it is importable and the device is cuda, else host",
    ),
    "cpu_blas": dict(
        type=click.Choice(CPU_BLAS_CHOICES),
        help="cpu only: the BLAS of the GEMMs, SYRKs and MP2 pair-step GEMMs; auto: per op and size, "
        "the faster of torch's (MKL) and numpy's OpenBLAS as measured on this machine (a few "
        "seconds once, cached in ~/.cache/dfmp2/cpu_blas.json; a table measured under load is "
        "measured again; -v shows it, dfmp2 bench --blas re-measures); torch or openblas: that "
        "one (the result's 'ran' says which ran)",
    ),
    "scf_mode": dict(
        type=click.Choice(SCF_MODES),
        help="RHF: df, ours with density fitting (JK-fit basis) on the device; pyscf-df, PySCF's "
        "DF-RHF on the host (the cross-check); exact, PySCF's RHF with exact integrals. "
        "Open shells: our DF-UHF (df), PySCF's DF-UHF (pyscf-df) or UHF (exact)",
    ),
    "scf_max_cycle": dict(
        type=click.IntRange(min=1),
        help="most SCF iterations; a run whose SCF has not converged by then stops; "
        "raise it for a slowly converging open shell",
    ),
    "scf_conv_tol_grad": dict(
        type=click.FloatRange(min=0, min_open=True),
        help="the orbital-gradient norm the SCF must reach (with |ΔE| < 1e-12 Eh); "
        "loosen it for a gradient that stalls once the energy has converged",
    ),
    "scf_screen": dict(
        type=click.FloatRange(min=0),  # the upper bound: RunOptions (its reason in the message)
        help="our DF-SCF (--scf df): keep the JK factor's shell pairs whose Schwarz bound "
        "sqrt((μν|μν)) is at least this (Hartree^1/2), as Psi4 and gpu4pyscf screen; less memory "
        f"and disk as molecules spread out. At most {SCF_SCREEN_MAX:g} (above it E(HF) is no longer "
        "approximated: 2e-4 Eh off for (H2O)8 at 1e-5); a run above 1e-8 warns",
    ),
    "scf_precision": dict(
        type=click.Choice(SCF_PRECISIONS),
        help="our DF-SCF's J/K (--scf df, RHF and UHF): mixed, the first cycles' exchange in fp32 "
        "(Fock matrix in fp64), then fp64 to the same thresholds (same E(HF) to 1e-10 "
        "Eh); fp64, every cycle; auto, mixed where the device has fast fp32 (cpu, cuda) "
        "and memory allows the factor's fp32 copy, else fp64 (trn: fp32 cycles, "
        "as ever)",
    ),
    "scf_stability": dict(
        help="check a converged UHF's internal stability (the lowest eigenvalue of its orbital "
        "Hessian, in the result; an instability is a warning); RHF: none"
    ),
    "dist_scf": dict(
        type=click.Choice(DIST_SCF_MODES),
        help="over several ranks (torchrun): our DF-SCF's JK factor split over the ranks, J and K "
        "summed each cycle in a fixed order, or the whole SCF on every rank (replicated: slower, each "
        "rank doing all the work; for a JK factor on disk over ranks); both give E(HF), E_OS and E_SS "
        "bit-identical to one process at the same threads per process; one process: either",
    ),
    "ranks_per_run": dict(
        type=click.IntRange(min=1),
        help="over several ranks (torchrun): interaction, a CBS bracket, frequencies and regress give "
        "each of their runs to a group of this many ranks (the run split over them, as one run over "
        "that many ranks), the groups in parallel, for runs too large for one rank; it must divide the "
        "number of ranks. Other commands: leave it out (their runs go over every rank, or one rank each)",
    ),
    "memory_mb": dict(
        help="memory limit per process, e.g. 8GB [default: 80% of available, shared by the ranks of a node]"
    ),
    "storage": dict(
        type=click.Choice(STORAGE_CHOICES),
        help="where B lives: in memory if the plan fits, else on disk (auto), or forced",
    ),
    "scratch_dir": dict(
        type=click.Path(file_okay=False),
        help="directory for out-of-core files, removed when the run ends [default: $TMPDIR or /tmp]",
    ),
    "checkpoint": dict(
        type=click.Path(dir_okay=False),
        help="write a checkpoint (HDF5: SCF, B, finished pair blocks) to this new file as the run goes",
    ),
    "resume": dict(
        type=click.Path(dir_okay=False),
        help="continue the interrupted run in this checkpoint (same molecule and options)",
    ),
    "cbs_scf": dict(
        type=click.Choice(CBS_SCF_SCHEMES),
        help="with a basis bracket: the SCF energy at the largest basis (xtpl_highest_1, Psi4's "
        "default), or extrapolated with Psi4's scf_xtpl_helgaker_2 (exp(-1.63 X), two levels) "
        "or scf_xtpl_helgaker_3 (three levels, e.g. cc-pv[dtq]z; the correlation energy "
        "then from the two largest)",
    ),
    "properties": dict(
        multiple=True,
        metavar="|".join(PROPERTY_CHOICES),
        show_default=False,
        help="after the energy, from the MP2 one-particle densities (the gradient's Z-vector, no "
        "derivative integrals): dipole, the HF, unrelaxed and relaxed MP2 dipole moments in debye and "
        "e*bohr about the input's origin (0, 0, 0) (PySCF's convention); needs --scf df or pyscf-df. "
        "Comma-separated or repeated",
    ),
    "method": dict(
        type=click.Choice(METHODS, case_sensitive=False),
        help="the energy: mp2 (DF-MP2 on the HF reference, SCS- and SOS-MP2 beside it) or a double hybrid: "
        "PySCF's DF-RKS/UKS with the functional's hybrid part on the host, then this program's PT2 stage on "
        "its orbitals with the functional's c_OS and c_SS, and its D3(BJ)/D4 dispersion "
        "(pyscf-dispersion) where its definition has one (docs/double_hybrids.md)",
    ),
    "dft_grid": dict(
        type=click.IntRange(0, 9),
        help="a double hybrid's KS-SCF grid: PySCF's grids.level, 0 (coarsest) to 9; 3, PySCF's default, "
        "gives 50-75 radial by 302 angular points per first- and second-row atom (pruned)",
    ),
    # tuning (tests, benchmarks), not in --help
    "occ_block_max": dict(type=click.IntRange(min=1), hidden=True),
    "j3c_block_mb": dict(type=click.FloatRange(min=0, min_open=True), hidden=True),
}
GROUPS = {
    "molecule": ("basis", "auxbasis", "charge", "multiplicity", "reference", "ecp", "frozen_core"),
    "device": ("device", "simulate", "precision", "pair_kernel", "integrals", "cpu_blas"),
    "scf": (
        "scf_mode",
        "scf_max_cycle",
        "scf_conv_tol_grad",
        "scf_screen",
        "scf_precision",
        "scf_stability",
        "dist_scf",
        "ranks_per_run",
    ),
    "resources": ("memory_mb", "storage", "scratch_dir", "occ_block_max", "j3c_block_mb"),
    "checkpoint": ("checkpoint", "resume"),
    "cbs": ("cbs_scf",),
    "properties": ("properties",),
    "method": ("method", "dft_grid"),
}


def shared_option(field: str, **changes):
    """The click option of RunOptions field ``field``: its flag, its default (RunOptions'; None
    shows as the help's own '[default: ...]'), ``SPECS[field]``, then ``changes``."""
    kw = {**SPECS[field], **changes}
    kw.setdefault("default", getattr(_DEFAULT, field))
    kw.setdefault("show_default", kw["default"] is not None and not kw.get("is_flag"))
    return click.option(flag(field), field, **kw)


def _group(name: str):
    def options(*, skip=(), **changes):
        unknown = (set(skip) | set(changes)) - set(GROUPS[name])
        if unknown:
            raise TypeError(f"{name} options have no {', '.join(sorted(unknown))}")

        def decorate(fn):
            for field in reversed([f for f in GROUPS[name] if f not in skip]):  # --help in GROUPS order
                fn = shared_option(field, **changes.get(field, {}))(fn)
            return fn

        return decorate

    options.__name__ = f"{name}_options"
    options.__doc__ = f"Decorator: the {name} options ({', '.join(GROUPS[name])}) but ``skip``."
    return options


molecule_options = _group("molecule")
device_options = _group("device")
scf_options = _group("scf")
resource_options = _group("resources")
checkpoint_options = _group("checkpoint")
cbs_options = _group("cbs")
properties_options = _group("properties")
method_options = _group("method")


def parse_memory(value: str | None) -> float | None:
    """'4000', '4000MB', '4GB', '512MiB', '1TB', '1TiB' -> MB (10^6 bytes)."""
    if value is None:
        return None
    s = value.strip().upper().replace(" ", "")
    units = {
        "TIB": 1024**4 / 1e6,
        "GIB": 1024**3 / 1e6,
        "MIB": 1024**2 / 1e6,
        "TB": 1e6,
        "GB": 1e3,
        "MB": 1.0,
        "T": 1e6,
        "G": 1e3,
        "M": 1.0,
    }
    for u, f in units.items():
        if s.endswith(u):
            s, factor = s[: -len(u)], f
            break
    else:
        factor = 1.0
    try:
        if "_" in s:  # float() would read '4_000' as 4000
            raise ValueError
        mb = float(s) * factor
    except ValueError:
        raise InputError(
            f"cannot read the memory limit '{value}'; give e.g. 4000MB or 4GB", option="memory_mb"
        ) from None
    if not math.isfinite(mb):  # 'nan', 'inf' and '1e400' all parse as floats
        raise InputError(
            f"the memory limit must be a finite size, got '{value}'; give e.g. 4000MB or 4GB", option="memory_mb"
        )
    if mb <= 0:
        raise InputError(f"the memory limit must be positive, got '{value}'", option="memory_mb")
    return mb


def run_options(params: dict, **fixed) -> RunOptions:
    """The RunOptions of a command from its click params: every param named after a RunOptions
    field (None: not given, RunOptions' default), the memory limit read by ``parse_memory``;
    ``fixed``: fields the command sets itself."""
    kw = {k: v for k, v in params.items() if k in RUN_FIELDS and v is not None}
    if "memory_mb" in kw:
        kw["memory_mb"] = parse_memory(kw["memory_mb"])
    return RunOptions(**{**kw, **fixed})


# the commands that deal their work over a launcher's ranks (docs/distributed.md says how)
RANK_AWARE = "dfmp2 run, gradient, optimize, interaction, frequencies, regress and compare of a molecule"


def one_process(command: str, why: str = "") -> None:
    """Refuse ``dfmp2 <command>`` when a launcher (torchrun, Slurm) started several processes: the
    command is not rank-aware (yet, or ``why``: the reason it runs in one process) and would run
    the whole job on every rank, printing it N times. Before any work: rank 0 raises the
    one InputError line, the other ranks exit 2 quietly (they cannot agree without joining the
    group, and need not: each reads the same launcher variables). The rank-aware commands, which
    the line names: ``RANK_AWARE``."""
    from dfmp2 import distributed

    launch = distributed.launched_world()
    if launch is None or launch[1] == 1:
        return
    if launch[0]:
        sys.exit(EXIT_USER_ERROR)
    raise InputError(
        f"dfmp2 {command} runs in one process{f' ({why})' if why else ''}; the launcher started {launch[1]} "
        f"(WORLD_SIZE): run it without torchrun or srun, or with one process ({RANK_AWARE} use several ranks)"
    )


def fail(message: str, code: int = EXIT_USER_ERROR):
    """End the command with one ``error:`` line on stderr and exit status ``code``; a newline in
    the message (from a path or a basis name) is escaped, so the line stays one.

    A run over ranks that failed keeps its process group (``distributed.World.close`` leaves it
    only where every rank is at the same point: a peer may be gone). The interpreter's exit then
    tears the group down, and gloo's threads sometimes abort the process there (SIGABRT,
    'terminate called without an active exception', exit -6 instead of 2, seen in
    the heavy channel). So such a process flushes its output and ends at once; what
    it wrote was closed by the ``finally`` blocks the error passed through."""
    click.echo(f"error: {one_line(message)}", err=True)
    if _process_group_open():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _process_group_open() -> bool:
    """Whether this process is still in a torch.distributed process group of several processes
    (never imported: no)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


# A console that is not a terminal (a file, a pipe) prints every line whole: this width, far
# beyond any table, so nothing folds, and text is never wrapped (soft_wrap)
NO_FOLD_WIDTH = 100_000


class ReportConsole(Console):
    """A rich Console whose tables wrap and never truncate: every column of every Table printed
    (nested ones too) folds its cells (rich's default cuts them with an ellipsis, and a ``no_wrap``
    column cuts them silently). Not a terminal (a file, a pipe: ``report_console``): nothing
    folds at all, and a table's title and caption are lines of their own (rich folds them to the
    table's width)."""

    def print(self, *objects, **kw) -> None:
        for obj in objects:
            _fold(obj)
        if self.is_terminal:
            super().print(*objects, **kw)
            return
        for obj in objects:
            self._print_whole(obj, **kw)

    def _print_whole(self, obj, **kw) -> None:
        from rich.table import Table
        from rich.text import Text

        if not isinstance(obj, Table) or not (obj.title or obj.caption):
            super().print(obj, **kw)
            return
        title, caption = obj.title, obj.caption
        obj.title = obj.caption = None
        try:
            if title:
                super().print(self.render_str(title) if isinstance(title, str) else title, soft_wrap=True)
            super().print(obj, **kw)
            if caption:
                cap = self.render_str(caption) if isinstance(caption, str) else caption
                super().print(Text(cap.plain) if isinstance(cap, Text) else cap, soft_wrap=True)
        finally:
            obj.title, obj.caption = title, caption


class StdoutConsole(ReportConsole):
    """A ReportConsole whose broken pipe raises BrokenPipeError (for ``printing``) instead of
    rich's own ``SystemExit(1)``."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))


def _fold(renderable) -> None:
    """Set every column of ``renderable`` (a rich Table, and the tables in its cells) to wrap and
    fold, never cut."""
    from rich.table import Table

    if not isinstance(renderable, Table):
        return
    for col in renderable.columns:
        col.overflow, col.no_wrap = "fold", False
        for cell in col._cells:
            _fold(cell)


def report_console(cls=ReportConsole, **kw) -> Console:
    """A ``cls`` console as is on a terminal; else one ``NO_FOLD_WIDTH`` wide that never wraps
    (logs, captions and tables in a file or pipe stay one line each, whatever their length)."""
    console = cls(**kw)
    return console if console.is_terminal else cls(width=NO_FOLD_WIDTH, soft_wrap=True, **kw)


def stdout_console(*documents) -> StdoutConsole:
    """The Console a command prints its tables with: on stdout, unless one of ``documents`` (the
    output paths a command writes: --json, --qcschema, -o) is standard output (``-``,
    /dev/stdout: io.outputs.is_stdout), which then holds that document alone and the tables go to
    stderr. The terminal's width, or no folding in a file or pipe (``report_console``)."""
    from dfmp2.io.outputs import is_stdout

    return report_console(StdoutConsole, stderr=any(is_stdout(p) for p in documents))


def wrote(err, *paths) -> None:
    """'wrote PATH' (dim) on ``err`` for each file written; nothing for standard output."""
    from rich.markup import escape

    from dfmp2.io.outputs import is_stdout

    for path in paths:
        if path and not is_stdout(path):
            err.print(f"[dim]wrote {escape(str(path))}[/dim]")


def blas_notices(err, quiet: bool) -> None:
    """The cpu BLAS measurements' notices (linalg.cpu_blas.take_notices: one line per measurement
    this process made, so once per state of the cache) on ``err``; none under -q."""
    from rich.markup import escape

    blas = sys.modules.get("dfmp2.linalg.cpu_blas")  # never imported: nothing measured
    for line in blas.take_notices() if blas is not None else ():
        if not quiet:
            err.print(f"[dim]note: {escape(line)}[/dim]")


def check_stdin(xyz_file, world) -> None:
    """INPUT ``-`` (standard input) reaches one process only: refused over several ranks."""
    from dfmp2.io.xyz import STDIN

    if str(xyz_file) == STDIN and world.distributed:
        raise InputError("INPUT -: standard input reaches one process, not every rank; give the molecule as a file")


def stderr_console() -> Console:
    """The Console of a command's logs, progress and notes (stderr; ``report_console``)."""
    return report_console(stderr=True)


STDOUT_FULL = (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EFBIG)


def _stdout_to_devnull() -> None:
    """Point file descriptor 1 at /dev/null, so the interpreter's last flush of what stdout still
    buffers does not fail again (Python's advice for SIGPIPE); not possible on a captured stdout."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except (OSError, ValueError, AttributeError):
        pass


@contextlib.contextmanager
def printing(written=()):
    """Around what a command prints on stdout, once the files it was asked for (``written``) are
    written: a reader that went away (``| head``, EPIPE) ends the printing quietly and the command
    goes on to its own exit status (0 for a finished run, compare's and regress's verdict), as
    ``head`` users expect; a stdout that cannot take the text (/dev/full, a full disk: ENOSPC,
    EIO) is one ``error:`` line on stderr and exit EXIT_USER_ERROR, the files already written stay."""
    try:
        yield
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    except OSError as e:
        if e.errno not in STDOUT_FULL:
            raise
        _stdout_to_devnull()
        done = [str(p) for p in written if p]
        fail(f"cannot write to standard output ({e.strerror})" + (f"; {', '.join(done)} written" if done else ""))


def user_errors(fn=None, *, interrupted=None):
    """Decorator of every command: an expected error (bad input, a device that cannot run, a
    kernel that failed) is one ``error:`` line (``error_line``: the message and the flag it is
    about) and exit EXIT_USER_ERROR, no traceback; Ctrl-C is 'error: interrupted' and
    EXIT_INTERRUPTED (130), SIGTERM or SIGHUP 'error: interrupted by SIGTERM' and 128 + its number
    (143, 129). ``interrupted(params)``: text after that (what is left, how to go on)."""
    if fn is None:
        return functools.partial(user_errors, interrupted=interrupted)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (InputError, DeviceUnavailableError, KernelError) as e:
            fail(error_line(e))
        except KeyboardInterrupt as e:
            by = f" by {e.name}" if isinstance(e, Terminated) else ""
            fail(
                f"interrupted{by}" + (interrupted(kwargs) if interrupted else ""),
                e.exit_code if isinstance(e, Terminated) else EXIT_INTERRUPTED,
            )

    return wrapper
