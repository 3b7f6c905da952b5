"""The RHF DF-MP2 gradient on trn1, simulated on this CPU (the NKI NumPy emulator): the densities'
pair loop on the device in fp32, the rest on a host CPU backend in fp64 (dfmp2.grad.mp2), against
the CPU fp64 gradient (itself checked against finite differences of our energies in
test_gradient.py). Two bounds, each from where the fp32 arithmetic enters:

- the stage alone, on one (CPU fp64) reference: only the pair loop is fp32. Its GEMMs carry a
  relative rounding of about eps32 = 1.2e-7 (times a slowly growing factor of the sums' lengths);
  the correlation gradient is ~0.03 Eh/bohr here, so ~1e-8. Bound STAGE_TOL = 1e-7 Eh/bohr
  (measured: 5e-9, water 6-31G frozen core, SCS-MP2).
- end to end (`dfmp2 gradient --device trn1 --simulate`): the trn SCF's J/K are fp32, so its
  orbitals are stationary for a Fock matrix carrying that rounding (their true fp64 orbital
  gradient |C_v^T F C_o| measured 5e-6 for water 6-31G, against 4e-12 on the CPU). The gradient is
  not variational in the orbitals: that error enters it linearly, with O(1) coefficients. Bound
  END_TOL = 5e-6 Eh/bohr (measured: 1.0e-6, SCF converged to 1e-10; 2.6e-7 at the default 1e-9).
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.grad import common as grad_common
from dfmp2.grad import mp2 as grad_mp2
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")
INPUTS = Path(__file__).resolve().parents[2] / "inputs"
STAGE_TOL = 1e-7  # Eh/bohr: the stage on one reference (the fp32 pair loop only)
END_TOL = 5e-6  # Eh/bohr: end to end (the fp32 SCF's orbitals dominate)
DISTORT = np.array([[0.013, -0.021, 0.008], [-0.017, 0.011, 0.024], [0.009, 0.019, -0.015]])


def _water():
    g = read_xyz(INPUTS / "water.xyz")
    return dataclasses.replace(g, coords_angstrom=g.coords_angstrom + DISTORT)


def _trn():
    return linalg.get_backend("trn1", simulate=True)


def test_stage_on_trn_matches_cpu_on_the_same_reference():
    opts = RunOptions(basis="6-31g", frozen_core=True)
    cpu = gradient_driver.run_gradient(_water(), opts, "scs-mp2")
    mol, ref = cpu.energy_run.mol, cpu.energy_run.ref
    auxmol = basis.make_auxmol(mol, basis.mp2_auxbasis(mol, opts.auxbasis))
    jk_auxmol = basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    trn = _trn()
    parts = grad_mp2.mp2_gradient(mol, ref, auxmol, jk_auxmol, trn, c_os=1.2, c_ss=1 / 3)
    diff = np.abs(parts.gradient - cpu.parts.gradient).max()
    assert 0.0 < diff < STAGE_TOL, diff  # nonzero: the pair loop did run in fp32
    assert parts.e_corr == pytest.approx(cpu.parts.e_corr, abs=1e-7)
    ran = parts.ran
    assert ran["device"] == "trn1" and ran["simulated"] is True and ran["engine"] == trn.engine
    assert set(ran["kernels"]) == {"gemm:nki.gemm"} and ran["host_device"] == "cpu"
    assert ran["host_precision"] == "fp64" and any(k.startswith("gemm:") for k in ran["host_kernels"])
    assert "fp32" in ran["precision"] and "pair loop" in ran["on_device"]


def test_end_to_end_on_trn_matches_cpu_fp64():
    geom = _water()
    opts = dict(basis="6-31g", scf_conv_tol_grad=1e-10)
    cpu = gradient_driver.run_gradient(geom, RunOptions(**opts))
    trn = gradient_driver.run_gradient(geom, RunOptions(device="trn1", simulate=True, **opts))
    diff = np.abs(trn.gradient - cpu.gradient).max()
    assert diff < END_TOL, diff
    assert trn.result.ran["simulated"] and trn.parts.ran["simulated"] is True
    assert trn.parts.ran["device"] == "trn1" and cpu.parts.ran["device"] == "cpu"
    assert "simulated" not in cpu.parts.ran


def test_cli_gradient_on_trn_simulated_writes_what_ran_where(tmp_path):
    out = tmp_path / "g.json"
    r = CliRunner().invoke(
        main,
        [
            "gradient",
            str(INPUTS / "water.xyz"),
            "--basis",
            "sto-3g",
            "-q",
            "--device",
            "trn1",
            "--simulate",
            "--json",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(
        main, ["gradient", str(INPUTS / "water.xyz"), "--basis", "sto-3g", "--device", "trn1", "--simulate"]
    )
    assert "pair loop on trn1 (fp32, simulated), the rest on the host cpu (fp64)" in " ".join(r.output.split())
    d = json.loads(out.read_text())
    g, ran = np.array(d["gradient"]["gradient"]), d["gradient"]["ran"]
    assert g.shape == (3, 3) and np.abs(g.sum(axis=0)).max() < 1e-5  # translation invariance
    assert ran["device"] == "trn1" and ran["simulated"] is True and ran["host_device"] == "cpu"
    assert {"op": "gemm", "kernel": "nki.gemm"} in [{k: r[k] for k in ("op", "kernel")} for r in ran["kernels"]]
    assert d["ran"]["simulated"] is True


def test_uhf_stage_refuses_a_device_without_fp64_and_the_rhf_stage_does_not():
    no_channels = type("Ref", (), {"channels": ()})()  # check_channels reads only the channels
    with pytest.raises(grad_common.GradientError, match="UHF DF-MP2 gradient needs fp64"):
        grad_mp2.check_channels(no_channels, _trn())  # the UHF stage's check
    grad_mp2.check_channels(no_channels, _trn(), fp32_pair_loop=True)  # mp2_gradient's check


@pytest.mark.heavy
def test_optimize_on_trn_simulated_reaches_the_cpu_minimum(tmp_path):
    """``dfmp2 optimize --device trn1 --simulate`` (water 6-31G from its input geometry): converged,
    and the final geometry is the CPU fp64 optimisation's to 1e-4 Å (geomeTRIC's convergence
    criteria, max |g| 4.5e-4 Eh/bohr, are far above the trn gradient's fp32 error)."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    finals = {}
    for name, dev in (("cpu", []), ("trn", ["--device", "trn1", "--simulate"])):
        finals[name] = tmp_path / f"{name}.opt.xyz"
        r = CliRunner().invoke(
            main,
            [
                "optimize",
                str(INPUTS / "water.xyz"),
                "--basis",
                "6-31g",
                "-q",
                *dev,
                "-o",
                str(finals[name]),
                "--trajectory",
                str(tmp_path / f"{name}.traj.xyz"),
            ],
        )
        assert r.exit_code == 0, r.output
    diff = np.abs(read_xyz(finals["trn"]).coords_angstrom - read_xyz(finals["cpu"]).coords_angstrom).max()
    assert diff < 1e-4, diff
