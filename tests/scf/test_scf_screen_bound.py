"""``scf_screen``'s bound (scripts/results/scf_screen.md): above SCF_SCREEN_MAX (1e-6) screening
is no approximation ((H2O)8's E(HF) 2e-4 Eh off at 1e-5, the S22 water dimer's 20 Eh at 1e-2), so it
is refused, by every command (the gradient's too); a run above SCF_SCREEN_QUIET (1e-8) warns. One error line naming
--scf-screen and exit 2 from the CLI, an InputError naming the option from the API."""

from pathlib import Path

import pytest
from click.testing import CliRunner

import dfmp2
from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
DIMER = INPUTS / "s22" / "s22_02_water_dimer.xyz"
SCF_SCREEN_MAX = 1e-6  # the bound the measurement set (dfmp2.options.SCF_SCREEN_MAX)


def one_error_line(args):
    r = CliRunner().invoke(main, args)
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == 2 and len(err) == 1 and err[0].startswith("error:"), r.output
    assert "--scf-screen" in err[0]
    return err[0]


@pytest.mark.parametrize("value", ["1e-5", "1e-2", "0.5"])
def test_a_threshold_above_the_bound_is_refused(value):
    line = one_error_line(["run", str(WATER), "--basis", "sto-3g", "-q", "--scf-screen", value])
    assert "1e-06" in line
    with pytest.raises(InputError, match="scf_screen") as e:
        dfmp2.energy(str(WATER), basis="sto-3g", scf_screen=float(value))
    assert e.value.option == "scf_screen"


@pytest.mark.parametrize("command", ["gradient", "optimize", "frequencies"])
def test_every_command_that_differentiates_refuses_it(command, tmp_path):
    """1e-5 is refused by the commands over the gradient too, before any work."""
    args = [command, str(WATER), "--basis", "sto-3g", "-q", "--scf-screen", "1e-5"]
    if command == "optimize":
        args += ["-o", str(tmp_path / "w.opt.xyz")]
    line = one_error_line(args)
    assert "1e-06" in line
    with pytest.raises(InputError, match="scf_screen") as e:
        dfmp2.gradient(str(WATER), basis="sto-3g", scf_screen=1e-5)
    assert e.value.option == "scf_screen"


def test_at_the_bound_a_run_warns_and_the_default_does_not():
    assert RunOptions(scf_screen=SCF_SCREEN_MAX).scf_screen == SCF_SCREEN_MAX
    loose = dfmp2.energy(str(WATER), basis="sto-3g", scf_screen=SCF_SCREEN_MAX)
    default = dfmp2.energy(str(WATER), basis="sto-3g")
    assert any("scf_screen 1e-06" in w for w in loose.warnings)
    assert not any("scf_screen" in w for w in default.warnings)


@pytest.mark.heavy
def test_at_the_bound_the_energy_is_still_an_approximation():
    """The water dimer (cc-pVDZ) at 1e-6 drops pairs and E(HF) stays within 1e-6 Eh of every pair's
    (measured 4.9e-7), E(MP2) likewise."""
    every = dfmp2.energy(str(DIMER), scf_screen=0.0)
    loose = dfmp2.energy(str(DIMER), scf_screen=SCF_SCREEN_MAX)
    s = loose.ran["scf"]["jk_factor"]["screening"]
    assert s["pairs_kept"] < s["pairs_total"]
    assert abs(loose.e_hf - every.e_hf) < 1e-6 and abs(loose.e_mp2 - every.e_mp2) < 1e-6
