"""The ``dfmp2`` command line (click). User mistakes print one ``error:`` line and exit 2.

The group loads each command's module when that command runs (``COMMANDS``): ``dfmp2 --help``
and ``dfmp2 --version`` import neither torch nor PySCF, and a command imports only what it uses.
The commands: run.py (run), interaction.py, gradient.py (gradient, optimize), frequencies.py,
compare.py, regress.py, bench.py.
"""

from __future__ import annotations

import importlib
import sys

import click
from click.utils import make_default_short_help

from dfmp2.errors import EXIT_INTERRUPTED

# name -> (module, attribute, summary). The summary is the command's first sentence, what
# `dfmp2 --help` lists without importing the module (tests/cli/test_cli_startup.py checks that
# it is the command's own).
COMMANDS = {
    "bench": (
        "dfmp2.cli.bench",
        "bench_command",
        "Per-shape timing report: ops and the DF-MP2 stage, measured, with baselines and estimates.",
    ),
    "compare": (
        "dfmp2.cli.compare",
        "compare_command",
        "Run one problem on several devices from identical inputs and compare the energies bit by bit.",
    ),
    "frequencies": (
        "dfmp2.cli.frequencies",
        "frequencies_command",
        "Harmonic frequencies, normal modes, IR intensities and thermochemistry of the molecule in INPUT "
        "(XYZ, Ångström) at its geometry (optimise it first: dfmp2 optimize), from central differences of "
        "analytic DF-MP2 gradients (6N + 1 of them).",
    ),
    "gradient": (
        "dfmp2.cli.gradient",
        "gradient_command",
        "The DF-MP2 energy of the molecule in INPUT (XYZ, Ångström) and its analytic nuclear gradient in "
        "Eh/bohr: RHF or UHF, density-fitted SCF, all-electron or frozen core.",
    ),
    "interaction": (
        "dfmp2.cli.interaction",
        "interaction_command",
        "Interaction energy of the fragments in XYZ_FILE (Ångström), counterpoise-corrected and not.",
    ),
    "optimize": (
        "dfmp2.cli.gradient",
        "optimize_command",
        "Optimise the geometry in INPUT (XYZ, Ångström) to a DF-MP2 minimum with geomeTRIC over the analytic "
        "gradient; writes the final XYZ and, beside it, the trajectory (also when it does not converge: then "
        "one error line and exit 2).",
    ),
    "regress": (
        "dfmp2.cli.regress",
        "regress_command",
        "Rerun molecules with PySCF reference energies and compare (exit 1 on any failure).",
    ),
    "run": (
        "dfmp2.cli.run",
        "run_command",
        "Compute the DF-MP2 energy of the molecule in INPUT: an XYZ file (coordinates in Ångström) or a "
        "QCSchema AtomicInput (*.json: molecule in Bohr, model mp2 and basis, keywords).",
    ),
}


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
            from dfmp2.distributed import announce_failure, launcher_rank

            if not launcher_rank():  # over several ranks every rank exits, rank 0 says why
                click.echo(f"error: {msg}", err=True)
            announce_failure(msg)  # ranks started by hand: the others end now, not at their join timeout
            sys.exit(e.exit_code)
        except click.Abort:  # Ctrl-C or EOF outside a command
            click.echo("error: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        # non-standalone click returns the exit code of --help/--version (ctx.exit) and the
        # command's return value otherwise (None for every dfmp2 command)
        sys.exit(rv if isinstance(rv, int) else 0)


class LazyGroup(OneLineErrorGroup):
    """The group of ``COMMANDS``, each imported on first use (click's lazy-loading pattern).
    ``commands`` (click's attribute: the loaded commands by name) loads them all, for code that
    walks every command's options; the help lists the summaries without loading any."""

    def __init__(self, *args, lazy=None, **kw):
        super().__init__(*args, **kw)
        self.lazy = dict(lazy or {})

    @property
    def commands(self) -> dict:
        for name in list(self.lazy):
            self._load(name)
        return self._commands

    @commands.setter
    def commands(self, value: dict) -> None:  # click.Group.__init__ sets it
        self._commands = value

    def _load(self, name: str):
        if name not in self._commands and name in self.lazy:
            module, attr, _ = self.lazy[name]
            self._commands[name] = getattr(importlib.import_module(module), attr)
        return self._commands.get(name)

    def list_commands(self, ctx) -> list:
        return sorted({*self._commands, *self.lazy})

    def get_command(self, ctx, cmd_name):
        return self._load(cmd_name)

    def format_commands(self, ctx, formatter) -> None:
        """click's listing of the commands and their short help, from the summaries of the
        commands not loaded yet (the same text: click's own shortening of the same sentence)."""
        names = [n for n in self.list_commands(ctx) if n not in self._commands or not self._commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows = [
            (n, self._commands[n].get_short_help_str(limit))
            if n in self._commands
            else (n, make_default_short_help(self.lazy[n][2], limit))
            for n in names
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dfmp2")
def main():
    """DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium."""


if __name__ == "__main__":
    main()
