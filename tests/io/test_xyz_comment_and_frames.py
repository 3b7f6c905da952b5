"""The XYZ comment line's charge and multiplicity in the forms users write ('1 2', 'charge 1,
multiplicity 2', 'charge: 1'), read and not silently ignored; a multi-frame XYZ refused in one line
naming its frames (not an 'atom count mismatch')."""

import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.io.molecule import electron_count
from dfmp2.io.xyz import parse_xyz

WATER = "3\n{}\nO 0 0 0.117\nH 0 0.757 -0.467\nH 0 -0.757 -0.467\n"


@pytest.mark.parametrize(
    "comment,state",
    [
        ("1 2", (1, 2)),
        ("-1 2", (-1, 2)),
        ("charge 1, multiplicity 2", (1, 2)),
        ("cation: charge: 1 mult: 2", (1, 2)),
        ("charge=1 multiplicity=2", (1, 2)),
        ("water, charge state as usual", (None, None)),
        ("charged water", (None, None)),
        ("1 2 3", (None, None)),
    ],
)
def test_comment_charge_and_multiplicity(comment, state):
    g = parse_xyz(WATER.format(comment))
    assert (g.charge, g.multiplicity) == state
    if state[0] is not None:
        assert electron_count(g)[:2] == state


@pytest.mark.parametrize(
    "comment,says",
    [("charge 1.5", "charge must be an integer"), ("1 0", "multiplicity must be 1 or more"), ("mult 2.0", "integer")],
)
def test_comment_state_that_is_not_an_integer_is_refused(comment, says):
    with pytest.raises(InputError, match=says):
        parse_xyz(WATER.format(comment), "w.xyz")


def test_options_override_the_comment_state():
    """As for 'charge=' (docs/cli-and-json.md): --charge and --multiplicity override the comment."""
    g = parse_xyz(WATER.format("1 2"))
    assert electron_count(g, 0, 1)[:2] == (0, 1)


def test_multi_frame_xyz_is_named(tmp_path):
    path = tmp_path / "traj.xyz"
    path.write_text("".join(WATER.format(f"frame {i}") for i in range(7)))
    with pytest.raises(InputError) as e:
        parse_xyz(path.read_text(), str(path))
    msg = str(e.value)
    assert "multi-frame XYZ: 7 frames" in msg and "line 6 starts the second" in msg and "head -n 5" in msg
    assert "mismatch" not in msg
    assert_one_line_error(CliRunner().invoke(main, ["run", str(path), "-q"]), "multi-frame XYZ: 7 frames")


def test_a_plain_count_mismatch_is_still_one():
    with pytest.raises(InputError, match="atom count mismatch: line 1 says 3 atoms, found 4"):
        parse_xyz(WATER.format("") + "H 0 0 2\n")
