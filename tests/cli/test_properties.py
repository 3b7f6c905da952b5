"""``--properties dipole`` on the command line (dfmp2.props): the JSON's ``properties.dipole`` with
its units and origin, the table, the gradient's dipole from its own densities, and one ``error:``
line (exit 2, before the SCF) for what cannot be computed. The numbers against PySCF's native
DF-MP2 relaxed density on its own DF-RHF with the same fitting sets (dipoles to 1e-5 D)."""

import json
from pathlib import Path

import numpy as np
import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from pyscf import gto, scf
from pyscf.mp import dfmp2_native

from dfmp2.cli.main import main
from dfmp2.interfaces import api

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = str(INPUTS / "water.xyz")
DIPOLE_TOL_D = 1e-5


def _pyscf_dipoles_d(xyz: str, basis: str, frozen=None) -> dict:
    """PySCF's HF and relaxed DF-MP2 dipoles (debye, origin 0) on its DF-RHF: the JK-fit and
    MP2-fit sets dfmp2 run picks for cc-pVDZ."""
    mol = gto.M(atom=Path(xyz).read_text().split("\n", 2)[2], basis=basis, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=f"{basis}-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    pt = dfmp2_native.DFMP2(mf, frozen=frozen, auxbasis=f"{basis}-ri")
    dip = lambda dm: scf.hf.dip_moment(mol, dm, unit="Debye", verbose=0)
    return {
        "hf": dip(mf.make_rdm1()),
        "unrelaxed": dip(pt.make_rdm1(relaxed=False, ao_repr=True)),
        "relaxed": dip(pt.make_rdm1(relaxed=True, ao_repr=True)),
    }


def _invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_run_properties_dipole_json_keys_units_and_pyscf(tmp_path):
    out = tmp_path / "w.json"
    r = _invoke("run", WATER, "--frozen-core", "--properties", "dipole", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert "dipole moment / D" in r.output and "MP2 relaxed" in r.output and "MP2 unrelaxed" in r.output
    d = json.loads(out.read_text())
    assert d["schema_version"] == "12"
    assert d["units"]["dipole"].startswith("debye and e*bohr") and d["units"]["dipole_origin"] == "bohr"
    dip = d["properties"]["dipole"]
    assert dip["units"] == {"au": "e*bohr", "debye": "debye"} and dip["method"] == "mp2"
    assert dip["origin"] == [0.0, 0.0, 0.0] and dip["origin_units"] == "bohr" and not dip["origin_dependent"]
    assert "PySCF" in dip["origin_rule"]
    ref = _pyscf_dipoles_d(WATER, "cc-pvdz", frozen=1)
    for kind in ("hf", "unrelaxed", "relaxed"):
        v = dip[kind]
        assert set(v) == {"au", "debye", "norm_au", "norm_debye"}
        assert np.allclose(np.array(v["au"]) * dip["au_to_debye"], v["debye"], rtol=1e-14, atol=0)
        assert v["norm_debye"] == pytest.approx(np.linalg.norm(v["debye"]), rel=1e-14)
        assert abs(np.array(v["debye"]) - ref[kind]).max() <= DIPOLE_TOL_D, kind
    dens = d["properties"]["densities"]
    assert dens["made_by"].startswith("the density stage") and dens["zvector"]["residual"] < 1e-8
    assert set(dens["timings"]) == {"props_mp2_densities", "props_jk_factor", "props_zvector"}
    assert all("op" in k for k in dens["ran"]["kernels"])  # kernel maps as lists: no '.' in a key


def test_gradient_properties_dipole_come_from_its_densities(tmp_path):
    out_run, out_grad = tmp_path / "r.json", tmp_path / "g.json"
    base = (WATER, "--basis", "6-31g", "--properties", "dipole")
    assert _invoke("run", *base, "--json", str(out_run)).exit_code == 0
    r = _invoke("gradient", *base, "--json", str(out_grad))
    assert r.exit_code == 0, r.output
    assert "dipole moment / D" in r.output
    run_dip = json.loads(out_run.read_text())["properties"]["dipole"]
    g = json.loads(out_grad.read_text())
    assert g["properties"]["densities"]["made_by"] == "the gradient stage"
    for kind in ("hf", "unrelaxed", "relaxed"):
        assert np.allclose(g["properties"]["dipole"][kind]["au"], run_dip[kind]["au"], atol=1e-8, rtol=0), kind


def test_run_without_properties_has_none():
    from dfmp2.options import RunOptions

    d = api.run(WATER, RunOptions(basis="sto-3g")).to_dict()
    assert d["properties"] is None and "dipole" not in d["units"]


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--properties", "quadrupole"], ["unknown property 'quadrupole'; use one of dipole", "(--properties)"]),
        (["--properties", "dipole,"], ["comma-separated list of names", "(--properties)"]),
        (["--properties", "dipole", "--scf", "exact"], ["need a density-fitted SCF", "(--properties, --scf)"]),
        (
            ["--properties", "dipole", "--reference", "uhf", "--device", "trn1", "--simulate"],
            ["need fp64 arithmetic", "(--properties, --device)"],
        ),
        (["--properties", "dipole", "--basis", "cc-pv[dt]z"], ["a CBS extrapolation does not carry them"]),
        (["--properties", "dipole", "--precision", "fp32"], ["computed in fp64", "(--properties, --precision)"]),
    ],
)
def test_properties_refused_in_one_line_before_the_scf(args, fragments, no_scf):
    assert_one_line_error(_invoke("run", WATER, "--basis", "sto-3g", *args), *fragments)


def test_properties_memory_is_checked_before_the_scf(no_scf):
    # water/cc-pVDZ: the energy fits in 0.8 MB (its DF-SCF needs 0.67 MB), the density stage does not (1.05 MB)
    r = _invoke("run", WATER, "--properties", "dipole", "--memory", "0.8MB")
    assert_one_line_error(r, "the density (properties) stage needs about 1.05 MB", "JK factor on disk", "(--memory)")
