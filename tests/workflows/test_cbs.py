"""CBS extrapolation with Psi4's bracket syntax (dfmp2/workflows/cbs.py).

The extrapolated energies are checked twice, with the formula written out here (not taken from
dfmp2.workflows.cbs): against two separate dfmp2 runs (``dfmp2.energy`` at cc-pVDZ and cc-pVTZ) and against
PySCF's own DF-RHF + DF-MP2 at the two bases (``pyscf.scf.RHF(...).density_fit`` with the JK-fit
set, ``pyscf.mp.dfmp2.DFMP2`` with the MP2-fit set: the same sets dfmp2 uses by default), combined
the same way. Psi4's default for ``energy("mp2/cc-pv[dt]z")``: the correlation energy by
corl_xtpl_helgaker_2 (alpha 3), the SCF at the largest basis (psi4/driver/driver_cbs.py,
_validate_cbs_inputs and _get_default_xtpl; the Psi4 manual's cbs() section says the same).
"""

import json
import math
from pathlib import Path

import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.workflows import cbs

ROOT = Path(__file__).resolve().parents[2]
WATER = ROOT / "inputs" / "water.xyz"
DIMER = ROOT / "inputs" / "s22" / "s22_02_water_dimer.xyz"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def helgaker_corl(x, e_x, y, e_y):
    """E_corr(CBS) = (Y^3 E_Y - X^3 E_X) / (Y^3 - X^3): Helgaker's two-point X^-3 formula."""
    return (y**3 * e_y - x**3 * e_x) / (y**3 - x**3)


# ---- the bracket ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "text,bases,zetas",
    [
        ("cc-pv[dt]z", ("cc-pvdz", "cc-pvtz"), (2, 3)),
        ("cc-pV[DT]Z", ("cc-pvdz", "cc-pvtz"), (2, 3)),
        ("aug-cc-pv[tq]z", ("aug-cc-pvtz", "aug-cc-pvqz"), (3, 4)),
        ("AUG-CC-PV[QT]Z", ("aug-cc-pvtz", "aug-cc-pvqz"), (3, 4)),  # out of order, as Psi4 allows
        ("cc-pv[23]z", ("cc-pvdz", "cc-pvtz"), (2, 3)),  # numerals, as Psi4 allows
        ("cc-pcv[q5]z", ("cc-pcvqz", "cc-pcv5z"), (4, 5)),
        ("def2-[st]zvp", ("def2-svp", "def2-tzvp"), (2, 3)),
        ("def2-[tq]zvp", ("def2-tzvp", "def2-qzvp"), (3, 4)),
        ("cc-pv[dtq]z", ("cc-pvdz", "cc-pvtz", "cc-pvqz"), (2, 3, 4)),
    ],
)
def test_bracket_expands_as_psi4(text, bases, zetas):
    b = cbs.parse_bracket(text)
    assert b.bases == bases and b.zetas == zetas


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("cc-pv[dq]z", "skips cc-pvtz"),
        ("cc-pv[d]z", "1 zeta level"),
        ("cc-pv[]z", "0 zeta levels"),
        ("cc-pv[dx]z", "'x' is not a zeta level"),
        ("cc-pv[dd]z", "given twice"),
        ("cc-pv[dt]z[tq]", "one pair of square brackets"),
        ("cc-pv[dtz", "one pair of square brackets"),
        ("6-31g[dt]", "only Dunning"),
        ("sto-[36]g", "only Dunning"),
    ],
)
def test_malformed_bracket_is_an_input_error(text, fragment):
    with pytest.raises(InputError) as e:
        cbs.parse_bracket(text)
    assert fragment in str(e.value) and e.value.option == "basis"


def test_scheme_rules():
    s = cbs.scheme("cc-pv[dt]z")
    assert s.scf == "xtpl_highest_1" and s.scf_zetas == (3,) and s.corl_zetas == (2, 3)
    assert cbs.scheme("cc-pv[dt]z", "scf_xtpl_helgaker_2").scf_zetas == (2, 3)
    three = cbs.scheme("cc-pv[dtq]z", "scf_xtpl_helgaker_3")
    assert three.scf_zetas == (2, 3, 4) and three.corl_zetas == (3, 4)
    for basis, scf in (("cc-pv[dtq]z", "xtpl_highest_1"), ("cc-pv[dt]z", "scf_xtpl_helgaker_3")):
        with pytest.raises(InputError) as e:
            cbs.scheme(basis, scf)
        assert set(e.value.option) == {"basis", "cbs_scf"}


def test_formulas_are_psi4s():
    """driver_cbs_helper.py, written out: corl (Y^a E_Y - X^a E_X)/(Y^a - X^a), a = 3;
    scf_xtpl_helgaker_2 E_X = E_CBS + b exp(-1.63 X); scf_xtpl_helgaker_3 the same with a fitted."""
    assert cbs.corl_xtpl_helgaker_2(2, -0.2, 3, -0.25) == pytest.approx((27 * -0.25 - 8 * -0.2) / 19, abs=1e-15)
    e_cbs, b, a = -76.06, 0.8, 1.63
    e = {x: e_cbs + b * math.exp(-a * x) for x in (2, 3, 4)}
    assert cbs.scf_xtpl_helgaker_2(2, e[2], 3, e[3]) == pytest.approx(e_cbs, abs=1e-12)
    e3 = {x: e_cbs + b * math.exp(-1.1 * x) for x in (2, 3, 4)}  # any alpha: fitted
    assert cbs.scf_xtpl_helgaker_3(2, e3[2], 3, e3[3], 4, e3[4]) == pytest.approx(e_cbs, abs=1e-12)
    with pytest.raises(InputError):  # not converging
        cbs.scf_xtpl_helgaker_3(2, -76.0, 3, -76.1, 4, -76.05)


# ---- the CLI's one-line errors ------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--basis", "cc-pv[dq]z"], "skips cc-pvtz"),
        (["--basis", "cc-pv[dt"], "one pair of square brackets"),
        (["--basis", "cc-pv[dtq]z"], "three zeta levels"),
        (["--cbs-scf", "scf_xtpl_helgaker_2"], "applies to a basis bracket"),
        (["--basis", "cc-pv[dt]z", "--checkpoint", "ck.h5"], "not checkpointed"),
    ],
)
def test_cli_bracket_errors_are_one_line(tmp_path, no_scf, args, fragment):
    res = CliRunner().invoke(main, ["run", str(WATER), *args, "--json", str(tmp_path / "o.json")])
    assert_one_line_error(res, fragment)
    assert not (tmp_path / "o.json").exists()


def test_compare_refuses_a_bracket(no_scf):
    """dfmp2 compare runs one basis per device (regress has no --basis: each reference's own)."""
    res = CliRunner().invoke(main, ["compare", str(WATER), "--basis", "cc-pv[dt]z"])
    assert_one_line_error(res, "is a basis bracket", "--basis")


def test_a_basis_the_element_lacks_stops_before_any_scf(tmp_path, no_scf):
    xyz = tmp_path / "ar.xyz"
    xyz.write_text("1\nxenon\nXe 0 0 0\n")  # cc-pVDZ has no Xe (cc-pVDZ-PP has)
    res = CliRunner().invoke(main, ["run", str(xyz), "--basis", "cc-pv[dt]z"])
    assert_one_line_error(res, "'cc-pvdz' is not defined for Xe", "--basis")


# ---- water cc-pV[DT]Z, frozen core: against two runs and against PySCF ----------------------------
def _pyscf_df_mp2(basis: str):
    """PySCF alone: DF-RHF with the JK-fit set, then DF-MP2 with the MP2-fit set, frozen core (1)."""
    from pyscf import df, gto, scf
    from pyscf.mp.dfmp2 import DFMP2

    mol = gto.M(atom=str(WATER), basis=basis, verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=f"{basis}-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    pt = DFMP2(mf, frozen=1)
    pt.with_df = df.DF(mol, auxbasis=f"{basis}-ri")
    pt.kernel()
    return mf.e_tot, pt.e_corr


@pytest.fixture(scope="module")
def water_dt(tmp_path_factory):
    out = tmp_path_factory.mktemp("cbs") / "cbs.json"
    res = CliRunner().invoke(
        main, ["run", str(WATER), "--basis", "cc-pV[DT]Z", "--frozen-core", "--json", str(out), "-q"]
    )
    assert res.exit_code == 0, res.output
    return res.output, json.loads(out.read_text())


def test_water_dt_matches_two_runs_and_pyscf(water_dt):
    import dfmp2

    output, doc = water_dt
    e = doc["energies"]
    dz = dfmp2.energy(str(WATER), basis="cc-pvdz", frozen_core=True)
    tz = dfmp2.energy(str(WATER), basis="cc-pvtz", frozen_core=True)
    # against the two separate runs of this program, combined here
    corl = helgaker_corl(2, dz.e_corr, 3, tz.e_corr)
    assert e["e_hf"] == pytest.approx(tz.e_hf, abs=1e-10)  # SCF at the largest basis
    assert e["e_corr"] == pytest.approx(corl, abs=1e-10)
    assert e["e_mp2"] == pytest.approx(tz.e_hf + corl, abs=1e-10)
    os_ = helgaker_corl(2, dz.e_os, 3, tz.e_os)
    ss = helgaker_corl(2, dz.e_ss, 3, tz.e_ss)
    assert e["e_scs_mp2"] == pytest.approx(tz.e_hf + 1.2 * os_ + ss / 3, abs=1e-10)
    assert e["e_sos_mp2"] == pytest.approx(tz.e_hf + 1.3 * os_, abs=1e-10)
    # against PySCF at the same bases and fitting sets, combined by the same formula
    assert (dz.jk_auxbasis, dz.auxbasis, tz.jk_auxbasis, tz.auxbasis) == (
        "cc-pvdz-jkfit",
        "cc-pvdz-ri",
        "cc-pvtz-jkfit",
        "cc-pvtz-ri",
    )
    (_, c2), (hf3, c3) = _pyscf_df_mp2("cc-pvdz"), _pyscf_df_mp2("cc-pvtz")
    ref = hf3 + helgaker_corl(2, c2, 3, c3)
    assert e["e_mp2"] == pytest.approx(ref, abs=1e-8), (e["e_mp2"], ref)
    assert e["e_corr"] == pytest.approx(helgaker_corl(2, c2, 3, c3), abs=1e-9)
    # the JSON names the formulas and holds every component
    assert doc["kind"] == "cbs" and doc["cbs"]["corl"]["scheme"] == "corl_xtpl_helgaker_2"
    assert doc["cbs"]["scf"]["scheme"] == "xtpl_highest_1" and doc["cbs"]["scf"]["bases"] == ["cc-pvtz"]
    assert doc["cbs"]["corl"]["alpha"] == 3.0 and "Y^3" in doc["cbs"]["corl"]["formula"]
    assert [c["basis"] for c in doc["components"]] == ["cc-pvdz", "cc-pvtz"]
    assert doc["components"][0]["energies"]["e_corr"] == pytest.approx(dz.e_corr, abs=1e-10)
    assert [r["basis"] for r in doc["runs"]] == ["cc-pvdz", "cc-pvtz"] and doc["runs"][1]["frozen_core"]
    assert "CBS / Eh" in output and "corl_xtpl_helgaker_2" in output
    # the Python API takes the bracket too, and gives the CLI's numbers
    api = dfmp2.energy(str(WATER), basis="cc-pv[dt]z", frozen_core=True)
    assert api.energies()["e_corr"] == pytest.approx(corl, abs=1e-10)
    assert api.energies()["e_mp2"] == pytest.approx(e["e_mp2"], abs=1e-10)


def test_scf_helgaker_2_on_request(tmp_path):
    """--cbs-scf scf_xtpl_helgaker_2 on H2 (fast): the SCF from both bases by Psi4's exp(-1.63 X)."""
    import dfmp2

    xyz = tmp_path / "h2.xyz"
    xyz.write_text("2\nH2\nH 0 0 0\nH 0 0 0.74\n")
    out = tmp_path / "h2.json"
    res = CliRunner().invoke(
        main, ["run", str(xyz), "--basis", "cc-pv[dt]z", "--cbs-scf", "scf_xtpl_helgaker_2", "--json", str(out), "-q"]
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    dz, tz = (dfmp2.energy(str(xyz), basis=b) for b in ("cc-pvdz", "cc-pvtz"))
    a = 1.63
    beta = (tz.e_hf - dz.e_hf) / (math.exp(-2 * a) * (math.exp(-a) - 1))
    hf = tz.e_hf - beta * math.exp(-3 * a)
    assert doc["energies"]["e_hf"] == pytest.approx(hf, abs=1e-10)
    assert doc["energies"]["e_mp2"] == pytest.approx(hf + helgaker_corl(2, dz.e_corr, 3, tz.e_corr), abs=1e-10)
    assert doc["cbs"]["scf"]["alpha"] == 1.63 and doc["cbs"]["scf"]["bases"] == ["cc-pvdz", "cc-pvtz"]


def test_interaction_at_the_cbs_limit(tmp_path):
    """(H2)2 at cc-pV[DT]Z: every one of the 2N+1 runs is extrapolated, and the interaction
    energies are differences of the extrapolated energies."""
    import dfmp2

    xyz = tmp_path / "h4.xyz"
    xyz.write_text("4\n(H2)2\nH 0 0 0\nH 0 0 0.74\n--\nH 0 3.0 0\nH 0 3.0 0.74\n")
    out = tmp_path / "ie.json"
    res = CliRunner().invoke(main, ["interaction", str(xyz), "--basis", "cc-pv[dt]z", "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["method"]["basis"] == "cc-pv[dt]z" and doc["method"]["cbs"]["corl"]["scheme"] == "corl_xtpl_helgaker_2"
    full = next(r for r in doc["runs"] if r["kind"] == "full")["result"]
    assert full["kind"] == "cbs" and [c["basis"] for c in full["components"]] == ["cc-pvdz", "cc-pvtz"]
    # the full system at both bases, on its own, combined here
    dz, tz = (dfmp2.energy(str(xyz), basis=b) for b in ("cc-pvdz", "cc-pvtz"))
    assert full["energies"]["e_mp2"] == pytest.approx(tz.e_hf + helgaker_corl(2, dz.e_corr, 3, tz.e_corr), abs=1e-10)
    # ΔE(noCP) from the extrapolated energies of the runs
    own = [r["result"]["energies"]["e_mp2"] for r in doc["runs"] if r["kind"] == "own"]
    assert doc["interaction_energies"]["nocp"]["MP2"]["hartree"] == pytest.approx(
        full["energies"]["e_mp2"] - sum(own), abs=1e-12
    )


# ---- a published Psi4 number -------------------------------------------------------------------
# psi4/psi4 tests/cbs-xtpl-energy/input.dat: water (O-H 1.0 Å, 104.5°), scf_type df, mp2_type df,
# all electrons correlated, e_convergence 7, checked there to 6 decimals:
#     energy('MP2/aug-cc-pVTZ')    = -76.341088480148
#     energy('MP2/aug-cc-pV[2T]Z') = -76.3667778886     (Psi4's default: corl_xtpl_helgaker_2, SCF at aTZ)
PSI4_MP2_ATZ = -76.341088480148
PSI4_MP2_ADTZ = -76.3667778886


def test_psi4_published_mp2_adtz(tmp_path):
    """Psi4's own test numbers (its DF fitting sets are the same aug-cc-pVXZ-JKFIT and -RI): here
    1.4e-9 Eh from aTZ and 3.3e-8 Eh from a[DT]Z (Psi4's e_convergence 7); bound 1e-6 Eh, the
    six decimals Psi4's test checks. Under a second."""
    theta = math.radians(104.5)
    xyz = tmp_path / "h2o.xyz"
    xyz.write_text(
        f"3\nPsi4 cbs-xtpl-energy water\nO 0 0 0\nH 0 0 1.0\nH {math.sin(theta):.15f} 0 {math.cos(theta):.15f}\n"
    )
    out = tmp_path / "adtz.json"
    res = CliRunner().invoke(main, ["run", str(xyz), "--basis", "aug-cc-pV[2T]Z", "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["components"][1]["energies"]["e_mp2"] == pytest.approx(PSI4_MP2_ATZ, abs=1e-6)
    assert doc["energies"]["e_mp2"] == pytest.approx(PSI4_MP2_ADTZ, abs=1e-6)
    assert [r["auxbasis"] for r in doc["runs"]] == ["aug-cc-pvdz-ri", "aug-cc-pvtz-ri"]
