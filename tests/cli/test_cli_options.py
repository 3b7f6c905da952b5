"""One option surface (dfmp2.cli.options): every command offers the RunOptions fields that apply
to it, with the library's choices, defaults and flags, passes them through to the run, and ends
with the one error handler; library errors name no CLI flag, the CLI's line does."""

from dataclasses import fields
from pathlib import Path

import click
import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner

import dfmp2
from dfmp2.cli import options as cli_options
from dfmp2.cli.main import main
from dfmp2.drivers import energy as energy_driver
from dfmp2.errors import EXIT_INTERRUPTED, EXIT_USER_ERROR, InputError, MemoryLimitError, error_line, flag
from dfmp2.options import (
    CBS_SCF_SCHEMES,
    ECP_CHOICES,
    INTEGRAL_ENGINES,
    PAIR_KERNEL_CHOICES,
    PRECISIONS,
    REFERENCES,
    SCF_MODES,
    STORAGE_CHOICES,
    RunOptions,
)
from dfmp2.workflows import interaction

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = str(INPUTS / "water.xyz")
DIMER = str(INPUTS / "s22" / "s22_02_water_dimer.xyz")
FIELDS = {f.name for f in fields(RunOptions)}
MOLECULE = {"basis", "auxbasis", "charge", "multiplicity", "reference", "ecp", "frozen_core"}
# the RunOptions fields each command offers; what it leaves out, and why
# properties (dfmp2.props) are of one molecule's run: run and gradient (from its own densities) only
# double hybrids (method, dft_grid: dfmp2.mp2.double_hybrids): run, and the gradient commands
# (gradient, optimize, frequencies: their own --method and --dft-grid; RKS: dfmp2.grad.dh)
DH = {"method", "dft_grid"}
OFFERED = {
    "run": FIELDS,
    "interaction": FIELDS - {"checkpoint", "resume", "properties"} - DH,  # 2N+1 runs are not checkpointed
    # --devices names several; one basis per run (a CBS bracket is refused)
    "compare": FIELDS - {"checkpoint", "resume", "device", "cbs_scf", "properties"} - DH,
    "gradient": FIELDS - {"checkpoint", "resume", "cbs_scf"},  # one basis, no checkpoint
    "optimize": FIELDS - {"checkpoint", "resume", "cbs_scf", "properties"},
    # each reference's own
    "regress": FIELDS - {"checkpoint", "resume", "scf_mode", "cbs_scf", "properties"} - MOLECULE - DH,
}
CHOICES = {
    "precision": PRECISIONS,
    "scf_mode": SCF_MODES,
    "reference": REFERENCES,
    "ecp": ECP_CHOICES,
    "storage": STORAGE_CHOICES,
    "integrals": INTEGRAL_ENGINES,
    "pair_kernel": PAIR_KERNEL_CHOICES,
    "cbs_scf": CBS_SCF_SCHEMES,
}
DEFAULTS_DIFFER = {("compare", "precision"): "fp64"}  # compare's tolerances need one precision


def _params(command):
    return {p.name: p for p in main.commands[command].params if isinstance(p, click.Option)}


def test_every_run_option_has_one_shared_definition():
    assert set(cli_options.SPECS) == FIELDS
    assert sorted(f for g in cli_options.GROUPS.values() for f in g) == sorted(FIELDS)


@pytest.mark.parametrize("command", sorted(OFFERED))
def test_commands_offer_the_library_options(command):
    """The option set of each command against RunOptions and the choices of dfmp2.options: a
    field added to RunOptions, or a choice added to the library, fails here until the command
    offers it (or this test says why not)."""
    params = _params(command)
    assert {name for name in params if name in FIELDS} == OFFERED[command]
    default = RunOptions()
    for name in OFFERED[command]:
        p = params[name]
        assert "/".join(p.opts + p.secondary_opts) == flag(name), name
        if name in CHOICES:  # offered, or parsed to be refused with the reason (cli.options.ShownChoice)
            parsed = (*p.type.choices, *getattr(p.type, "refused", ()))
            assert sorted(parsed) == sorted(CHOICES[name]) and len(parsed) == len(set(parsed)), name
        assert p.default == DEFAULTS_DIFFER.get((command, name), getattr(default, name)), name


def test_option_flags():
    assert flag("memory_mb") == "--memory" and flag("scratch_dir") == "--scratch"
    assert flag("scf_mode") == "--scf" and flag("frozen_core") == "--frozen-core/--all-electron"
    assert flag("scf_max_cycle") == "--scf-max-cycle" and flag("fragments") == "--fragments"


def test_run_options_takes_the_fields_and_reads_the_memory_limit():
    o = cli_options.run_options(
        {"basis": "sto-3g", "memory_mb": "2GB", "charge": None, "json_path": "x", "occ_block_max": None}, device="cuda"
    )
    assert o == RunOptions(basis="sto-3g", memory_mb=2000.0, device="cuda")


class Stop(InputError):
    """Raised by a patched runner once it has the options: the command ends with exit 2."""


@pytest.fixture
def captured(monkeypatch):
    """The RunOptions the commands hand to the pipeline (run, compare, regress) or to
    run_interaction; nothing runs."""
    seen = []

    def capture(options):
        seen.append(options)
        raise Stop("stopped by the test")

    monkeypatch.setattr(energy_driver, "prepare", lambda geom, options, *a, **k: capture(options))
    monkeypatch.setattr(interaction, "run_interaction", lambda geom, frags, options, **k: capture(options))
    return seen


SHARED = [
    "--scf-max-cycle",
    "7",
    "--memory",
    "3GB",
    "--storage",
    "disk",
    "--integrals",
    "host",
    "--pair-kernel",
    "auto",
    "--occ-block-max",
    "3",
    "--j3c-block-mb",
    "1.5",
]
MOLECULE_ARGS = [
    "--ecp",
    "none",
    "--reference",
    "uhf",
    "--auxbasis",
    "cc-pvdz-ri",
    "--frozen-core",
    "--scf",
    "pyscf-df",
]


@pytest.mark.parametrize(
    "args",
    [
        ["run", WATER, *MOLECULE_ARGS, "--charge", "0", "--multiplicity", "1"],
        ["interaction", DIMER, "--fragments", "1-3,4-6", *MOLECULE_ARGS],
        ["compare", WATER, "--devices", "cpu", "--repeat", "1", *MOLECULE_ARGS, "--charge", "0"],
        ["regress", "water|cc-pvdz|cc-pvdz-ri|df|fc"],
    ],
    ids=lambda a: a[0],
)
def test_options_reach_the_run(captured, tmp_path, args):
    res = CliRunner().invoke(main, [*args, *SHARED, "--scratch", str(tmp_path)])
    assert res.exit_code in (1, 2) and "Traceback" not in res.output, res.output  # regress: the case failed
    (o,) = captured
    assert (o.scf_max_cycle, o.memory_mb, o.storage, o.integrals, o.scratch_dir) == (
        7,
        3000.0,
        "disk",
        "host",
        str(tmp_path),
    )
    assert (o.occ_block_max, o.j3c_block_mb) == (3, 1.5)
    if args[0] != "regress":
        assert (o.ecp, o.reference, o.auxbasis, o.frozen_core, o.scf_mode) == (
            "none",
            "uhf",
            "cc-pvdz-ri",
            True,
            "pyscf-df",
        )
    else:  # the reference's own settings
        assert (o.basis, o.auxbasis, o.scf_mode, o.frozen_core, o.precision) == ("cc-pvdz", None, "df", True, "fp64")
    if args[0] in ("run", "compare"):
        assert o.charge == 0


def test_every_command_has_the_one_error_handler():
    handler = cli_options.user_errors(lambda: None).__code__
    for name, command in main.commands.items():
        assert command.callback.__code__ is handler, name


def test_interrupt_is_one_line_and_130(monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(interaction, "run_interaction", interrupted)
    res = CliRunner().invoke(main, ["interaction", DIMER, "--fragments", "1-3,4-6"])
    assert res.exit_code == EXIT_INTERRUPTED == 130 and res.output.strip() == "error: interrupted"


@pytest.mark.parametrize(
    "options,option,line_end",
    [
        ({"charge": 12}, "charge", "check the charge (--charge)"),
        ({"charge": 1, "multiplicity": 1}, ("charge", "multiplicity"), "multiplicity (--charge, --multiplicity)"),
        ({"basis": "no-such-basis"}, "basis", "choose another basis (--basis)"),
        ({"reference": "rohf"}, "reference", "use a UHF reference (the default for open shells) (--reference)"),
        ({"multiplicity": 0}, "multiplicity", "3 for a triplet) (--multiplicity)"),
        ({"memory_mb": 0.01}, "memory_mb", "raise the memory limit (--memory)"),
    ],
)
def test_library_errors_name_no_flag_but_the_cli_line_does(no_scf, options, option, line_end):
    with pytest.raises(InputError) as e:
        dfmp2.energy(WATER, **options)
    assert "--" not in str(e.value) and e.value.option == option
    assert error_line(e.value).endswith(line_end)
    args = [a for k, v in options.items() for a in (flag(k).split("/")[0], str(v))]
    assert_one_line_error(CliRunner().invoke(main, ["run", WATER, *args]), line_end)


def test_error_line_adds_the_flags_of_the_options():
    assert (
        error_line(InputError("what is wrong", option=("fragments", "scf_mode")))
        == "what is wrong (--fragments, --scf)"
    )
    assert error_line(InputError("plain")) == "plain"
    assert error_line(MemoryLimitError("too big")) == "too big (--memory)"
    assert EXIT_USER_ERROR == 2


def test_interaction_errors_name_the_fragment_options():
    from dfmp2.io.xyz import read_xyz

    with pytest.raises(InputError) as e:
        interaction.resolve_fragments(read_xyz(DIMER), "1-3", None, None)
    assert "--" not in str(e.value) and e.value.option == "fragments"
    with pytest.raises(InputError) as e:
        interaction.resolve_fragments(read_xyz(DIMER), "1-3,4-6", "1,x")
    assert "--" not in str(e.value) and error_line(e.value).endswith("(--fragment-charges)")


def test_output_checks_name_the_option_they_were_given(tmp_path):
    from dfmp2.io.outputs import check_output_dir

    with pytest.raises(InputError) as e:
        check_output_dir(tmp_path / "missing", "scratch directory", option="scratch_dir")
    assert "--" not in str(e.value) and error_line(e.value).endswith("does not exist (--scratch)")
