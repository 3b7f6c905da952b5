"""Output that survives a pipe: with stdout a pipe or a file, every table cell is whole
(wrapped, never cut to '…'), and the gradient stage prints progress lines on stderr unless -q."""

import json
import subprocess
import sys

import pytest

WATER = "3\nwater\nO 0.0 0.0 0.0\nH 0.0 0.757 0.587\nH 0.0 -0.757 0.587\n"


def _right_column(text: str) -> str:
    """The second column of the box tables in ``text``, joined (a folded cell is contiguous)."""
    return "".join(ln.split("│")[2].strip() for ln in text.splitlines() if ln.startswith("│") and ln.count("│") >= 3)


@pytest.mark.heavy
def test_piped_and_redirected_tables_keep_every_cell_whole(tmp_path):
    deep = tmp_path / ("a_rather_long_directory_name_" * 3) / ("and_another_one_" * 3)
    deep.mkdir(parents=True)
    src = deep / "water_with_a_long_name.xyz"
    src.write_text(WATER)
    out = tmp_path / "w.json"
    cmd = [sys.executable, "-m", "dfmp2", "run", str(src), "--basis", "sto-3g", "--json", str(out)]
    piped = subprocess.run(cmd, capture_output=True, text=True, timeout=300)  # stdout: a pipe
    assert piped.returncode == 0, piped.stderr
    with open(tmp_path / "report.txt", "w") as f:  # stdout: a file
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.PIPE, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    kernels = [k["kernel"] for k in json.loads(out.read_text())["ran"]["kernels"]]
    for text in (piped.stdout, (tmp_path / "report.txt").read_text()):
        assert "…" not in text
        assert str(src) in "".join(ln.strip() for ln in text.splitlines())  # the title's input path, whole
        cells = _right_column(text)
        assert kernels and all(k in cells for k in kernels)


@pytest.mark.heavy
def test_gradient_prints_stage_progress_unless_quiet(tmp_path):
    src = tmp_path / "w.xyz"
    src.write_text(WATER)
    cmd = [sys.executable, "-m", "dfmp2", "gradient", str(src), "--basis", "sto-3g"]
    loud = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert loud.returncode == 0, loud.stderr
    lines = [ln for ln in loud.stderr.splitlines() if ln.strip().startswith("gradient:")]
    for stage in ("MP2 densities", "Z-vector", "derivative integrals", "JK factor"):
        assert any(stage in ln and ln.rstrip().endswith(" s") for ln in lines), (stage, loud.stderr)
    quiet = subprocess.run(cmd + ["-q"], capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "gradient:" not in quiet.stderr
