"""Where ``dfmp2 optimize`` writes: the final geometry to ``-o`` (default: INPUT's name with
.opt.xyz in the current directory) and the trajectory beside it (default), nothing else."""

import pytest
from click.testing import CliRunner

from dfmp2.cli.gradient import trajectory_beside
from dfmp2.cli.main import main


@pytest.mark.parametrize(
    "final, traj",
    [
        ("w.opt.xyz", "w.traj.xyz"),
        ("out/w.xyz", "out/w.traj.xyz"),
        ("out/w.opt.xyz", "out/w.traj.xyz"),
        ("/abs/final", "/abs/final.traj.xyz"),
        ("a.traj.xyz", "a.traj.traj.xyz"),  # never the final geometry itself
    ],
)
def test_the_trajectory_goes_beside_the_final_geometry(final, traj):
    assert trajectory_beside(final) == traj


def test_optimize_with_o_writes_nothing_into_the_current_directory(tmp_path, monkeypatch):
    """A single atom (one evaluation, converged) with -o elsewhere: the trajectory lands beside
    -o, the current directory stays empty."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    cwd, out = tmp_path / "cwd", tmp_path / "out"
    cwd.mkdir()
    out.mkdir()
    (tmp_path / "ne.xyz").write_text("1\n\nNe 0 0 0\n")
    monkeypatch.chdir(cwd)
    r = CliRunner().invoke(
        main, ["optimize", str(tmp_path / "ne.xyz"), "--basis", "6-31g", "-q", "-o", str(out / "ne.xyz")]
    )
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["ne.traj.xyz", "ne.xyz"]
    assert list(cwd.iterdir()) == []
    assert "trajectory" in r.stdout and str(out / "ne.traj.xyz") in r.stdout
