"""Each command's --help offers only what the command accepts: every choice its help lists for an
option passes the command's own checks (the gradient's for gradient, optimize and frequencies;
the run's preparation for all). ``frequencies --help`` offered a basis bracket, --scf exact,
ROHF and the double hybrids, and each was then refused; those still parse, to be refused in one
line with the reason, but no help lists them (the gradient commands offer the double hybrids:
dfmp2.grad.dh)."""

import re

import click
import pytest
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.cli.options import RUN_FIELDS, run_options
from dfmp2.drivers.gradient import (
    check_double_hybrid_reference,
    check_gradient_method,
    check_gradient_reference,
    gradient_options,
)
from dfmp2.drivers.job import prepare
from dfmp2.errors import InputError
from dfmp2.io.xyz import read_xyz
from dfmp2.linalg import DeviceUnavailableError
from dfmp2.options import CBS_SCF_SCHEMES
from dfmp2.workflows import cbs

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = "3\nwater\nO 0.000 0.000 0.117\nH 0.000 0.757 -0.467\nH 0.000 -0.757 -0.467\n"
POINT = ("gradient", "optimize", "frequencies")
# a choice made for another device is checked on that device (absent here: not a refusal); a
# CBS SCF scheme with a basis bracket of its levels
CONTEXT = {
    **{("cbs_scf", s): ["--basis", "cc-pv[dtq]z" if s.endswith("_3") else "cc-pv[dt]z"] for s in CBS_SCF_SCHEMES},
    ("precision", "fp32"): ["--device", "trn1", "--simulate"],
    ("pair_kernel", "fused"): ["--device", "cuda"],
    ("integrals", "gpu4pyscf"): ["--device", "cuda"],
}


def command(name: str) -> click.Command:
    return main.get_command(click.Context(main), name)


def offered(name: str):
    """(param, choice) for every choice the command's --help lists, read from the help text."""
    text = CliRunner().invoke(main, [name, "--help"], terminal_width=400).output
    for param in command(name).params:
        if isinstance(param, click.Option) and isinstance(param.type, click.Choice):
            flag = max(param.opts, key=len)
            m = re.search(re.escape(flag) + r" \[([^\]]+)\]", text)
            assert m, f"{name} --help lists no choices of {flag}"
            for choice in m.group(1).split("|"):
                yield param, choice


def checks(name: str, args: list[str], xyz) -> None:
    """The command's checks of its options, before any work (InputError when it refuses one):
    the gradient's for the gradient commands, then the run's preparation (the options' choices,
    the reference, the basis, the devices' paths)."""
    ctx = command(name).make_context(name, [str(xyz), *args])
    own = {"method"} if name in POINT else set()  # the gradient commands' --method is theirs, not RunOptions'
    options = run_options({k: v for k, v in ctx.params.items() if k in RUN_FIELDS and k not in own})
    if cbs.is_bracket(options.basis):  # dfmp2 run's CBS workflow
        cbs.scheme(options.basis, options.cbs_scf)
        return
    check = None
    if name in POINT:  # the gradient's own checks (run_gradient's, check_gradient_options')
        options, method = gradient_options(options, ctx.params["method"])
        check_gradient_method(options, method)

        def check(uhf):
            check_gradient_reference(options, uhf)
            check_double_hybrid_reference(options, uhf)

    prepare(read_xyz(xyz), options, check=check)


@pytest.mark.parametrize("name", [*POINT, "run"])
def test_every_choice_a_command_s_help_offers_passes_its_checks(tmp_path, name):
    xyz = tmp_path / "water.xyz"
    xyz.write_text(WATER)
    refused = []
    for param, choice in offered(name):
        args = [*CONTEXT.get((param.name, choice), []), max(param.opts, key=len), choice]
        try:
            checks(name, ["--basis", "sto-3g", *args], xyz)
        except DeviceUnavailableError:  # that device (or engine) is not on this machine
            pass
        except InputError as e:
            refused.append(f"{' '.join(args)}: {e}")
    assert not refused, f"dfmp2 {name} --help offers what it refuses:\n" + "\n".join(refused)


@pytest.mark.parametrize("name", POINT)
def test_the_gradient_commands_help_offers_no_bracket_or_exact_scf(name):
    """gradient, optimize and frequencies offer the double hybrids (dfmp2.grad.dh) and --dft-grid."""
    text = CliRunner().invoke(main, [name, "--help"], terminal_width=400).output
    assert "--scf [df|pyscf-df]" in text
    assert "--reference [auto|rhf|uhf]" in text
    assert "--method [mp2|scs-mp2|sos-mp2|b2plyp|" in text and "--dft-grid" in text
    assert "dsd-pbep86" in text
    for word in ("exact", "extrapolat", "Helgaker", "rohf"):
        assert word not in text, word


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--scf", "exact"], "needs a density-fitted SCF"),
        (["--reference", "rohf"], "ROHF references are not supported"),
        (["--basis", "cc-pv[dt]z"], "basis bracket"),
    ],
)
def test_what_the_help_leaves_out_is_still_refused_with_its_reason(tmp_path, args, message):
    xyz = tmp_path / "water.xyz"
    xyz.write_text(WATER)
    r = CliRunner().invoke(main, ["frequencies", str(xyz), *args, "-q"])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output
    assert r.output.strip().count("\n") == 0, r.output
