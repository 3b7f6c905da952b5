"""Effective core potentials: a basis that comes with an ECP gets it (--ecp auto),
stated in the table and the JSON; electron counts and the frozen core count the electrons the
ECP replaced; --ecp none runs all-electron with a warning. Energies against PySCF run with the
same ECP and auxiliary bases, spelled out independently in scripts/make_ecp_references.py
(inputs/references_ecp.json)."""

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.errors import InputError
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.xyz import parse_xyz, read_xyz
from dfmp2.options import RunOptions

ROOT = Path(__file__).resolve().parents[2]
REFS = json.loads((ROOT / "inputs" / "references_ecp.json").read_text())["references"]
HI = ROOT / "inputs" / "ecp" / "hydrogen_iodide.xyz"


def geometry(atoms: str, name="mol.xyz"):
    lines = atoms.strip().splitlines()
    return parse_xyz(f"{len(lines)}\n\n" + "\n".join(lines) + "\n", name)


def test_every_case_of_the_script_is_stored_with_provenance():
    spec = importlib.util.spec_from_file_location("mkecp", ROOT / "scripts" / "make_ecp_references.py")
    mkecp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mkecp)
    assert sorted(REFS) == sorted(mkecp.key(m, b, fc) for m, b, fc, _ in mkecp.CASES)
    for e in REFS.values():
        assert "DFMP2" in e["method"] and "ecp=B" in e["method"] and e["pyscf_version"] and e["date"]
        assert e["ecp"] == e["basis"] and e["ecp_core_electrons"]


@pytest.mark.parametrize("key", sorted(REFS))
def test_ecp_energies_match_pyscf_with_the_same_ecp(key):
    ref = REFS[key]
    r = run(read_xyz(ROOT / ref["path"]), RunOptions(basis=ref["basis"], frozen_core=ref["frozen_core"]))
    for f, ours in (("e_hf", r.e_hf), ("e_os", r.e_os), ("e_ss", r.e_ss), ("e_corr", r.e_corr)):
        assert abs(ours - ref[f]) <= 1e-9, (f, ours - ref[f])
    assert (r.nbasis, r.naux, r.nocc, r.nfrozen, r.nvir) == (
        ref["nbasis"],
        ref["naux"],
        ref["nocc"],
        ref["nfrozen"],
        ref["nvir"],
    )
    heavy = sorted(ref["ecp_core_electrons"])
    assert r.ecp == {"name": ref["basis"], "elements": heavy, "core_electrons": ref["ecp_core_electrons"]}
    # PySCF's def2-*-ri files stop at Kr: the heavy elements get the BSE package's def2-*-RIFIT
    assert all(ref["mp2_auxbasis"][el] in r.auxbasis and ref["mp2_auxbasis"][el].endswith("-rifit") for el in heavy), (
        r.auxbasis
    )


def test_cli_states_the_ecp_in_table_and_json(tmp_path):
    out = tmp_path / "hi.json"
    res = CliRunner().invoke(main, ["run", str(HI), "--basis", "def2-svp", "--frozen-core", "--json", str(out)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "def2-svp for I (core electrons replaced: I 28)" in text
    d = json.loads(out.read_text())
    assert d["ecp"] == {"name": "def2-svp", "elements": ["I"], "core_electrons": {"I": 28}}
    assert d["shapes"]["nfrozen"] == 4 and d["shapes"]["nocc"] == 9  # 26 electrons: 13 pairs
    ref = REFS["hydrogen_iodide|def2-svp|fc"]
    assert abs(d["energies"]["e_corr"] - ref["e_corr"]) <= 1e-9


def test_all_electron_basis_has_no_ecp(tmp_path):
    r = run(read_xyz(ROOT / "inputs" / "water.xyz"), RunOptions())
    assert r.ecp is None and r.to_dict()["ecp"] is None


def test_ecp_none_refuses_a_basis_made_for_an_ecp_and_none_for_testing_runs_it_with_a_warning(tmp_path):
    """HI/def2-SVP all-electron gave E(HF) -1996.9 Eh (about -7117 all-electron in a real basis)
    with a warning and exit 0: 'none' now refuses it before any SCF; the option whose name says
    it is for testing runs it, warned."""
    res = CliRunner().invoke(main, ["run", str(HI), "--basis", "def2-svp", "--ecp", "none"])
    assert res.exit_code == 2 and res.output.count("error: ") == 1 and "Traceback" not in res.output
    assert "made for an effective core potential on I" in res.output and "(--ecp)" in res.output
    r = run(read_xyz(HI), RunOptions(basis="def2-svp", ecp="none-for-testing"))
    assert r.ecp is None and r.nocc == 27  # 54 electrons
    assert any(
        "none-for-testing" in w and "--" not in w and "effective core potential on I" in w and "meaningless" in w
        for w in r.to_dict()["warnings"]
    )
    water = run(read_xyz(ROOT / "inputs" / "water.xyz"), RunOptions(ecp="none"))  # nothing to drop
    assert water.ecp is None and water.warnings == []


def test_ecp_none_with_too_few_functions_is_one_error_line(tmp_path):
    """I2 in def2-SVP all-electron: 106 electrons in 52 functions."""
    out = tmp_path / "out.json"
    res = CliRunner().invoke(
        main,
        [
            "run",
            str(ROOT / "inputs" / "ecp" / "diiodine.xyz"),
            "--basis",
            "def2-svp",
            "--ecp",
            "none-for-testing",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 2 and "Traceback" not in res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "no virtual orbitals" in errors[0], res.output
    assert not out.exists()


def test_electron_counts_and_frozen_core_count_the_ecp_cores():
    g = geometry("H 0 0 0\nI 0 0 1.6092")
    mol = molecule.build_molecule(g, "def2-svp")
    assert mol.nelectron == 26 and molecule.frozen_core_count(mol) == 4  # 4s4p; 1s-3d are in the ECP
    ae = molecule.build_molecule(g, "def2-svp", ecp="none-for-testing")
    assert ae.nelectron == 54 and molecule.frozen_core_count(ae) == 18
    # the occupied shells of H and I hold 56 electrons, 28 of them in the ECP core
    assert molecule.build_molecule(g, "def2-svp", charge=-2).nelectron == 28
    with pytest.raises(InputError, match=r"30 electrons outside the ECP cores .28 electrons., more than the 28"):
        molecule.build_molecule(g, "def2-svp", charge=-4)
    with pytest.raises(InputError, match="unknown ECP setting 'yes'"):
        molecule.build_molecule(g, "def2-svp", ecp="yes")


def test_other_ecp_bases_get_their_ecp():
    """LANL2DZ on Cu (10-electron core) and cc-pVDZ-PP on I come with PySCF's ECPs too."""
    mol = molecule.build_molecule(geometry("Cu 0 0 0\nH 0 0 1.46"), "lanl2dz")
    assert molecule.ecp_info(mol) == {"name": "lanl2dz", "elements": ["Cu"], "core_electrons": {"Cu": 10}}
    assert mol.nelectron == 20
    assert molecule.ecp_core_electrons("cc-pvdz-pp", ["I", "Cs"]) == {"I": 28}  # PySCF has no Cs in it
    assert molecule.ecp_core_electrons("cc-pvdz", ["O", "H"]) == {}


def test_fallback_aux_beyond_krypton_only_with_the_ecp():
    """LANL2DZ has no matched fitting set: with its ECP on I, the def2 fallbacks apply beyond Kr
    (def2-universal-jkfit; PySCF's def2-tzvpp-ri lacks I, and AutoAux fails on LANL2DZ's shells, so
    the even-tempered set for the MP2 fit). All-electron, I gets AutoAux for the MP2 fit
    (test_chemistry_inputs.test_autoaux_beyond_krypton_matches_pyscf)."""
    g = geometry("H 0 0 0\nI 0 0 1.6092")
    with_ecp = molecule.build_molecule(g, "lanl2dz")
    assert basis.default_auxbasis(with_ecp, "jk") == {"H": "def2-universal-jkfit", "I": "def2-universal-jkfit"}
    mp2 = basis.default_auxbasis(with_ecp, "mp2")
    assert mp2["H"] == "def2-tzvpp-ri" and isinstance(mp2["I"], list)  # even-tempered shells
    ae = molecule.build_molecule(g, "sto-3g")
    assert molecule.ecp_info(ae) is None and basis.default_auxbasis(ae, "mp2")["I"] == "autoaux"


def test_lanl2dz_gets_an_even_tempered_mp2_fit_where_autoaux_fails():
    """PySCF's AutoAux raises IndexError on LANL2DZ's s/p-only shells of I (the run exited 1
    with a traceback); the fallback chain ends in PySCF's own default for an unknown basis, the
    even-tempered set, named in the warnings. Energies against PySCF with the same fitting sets."""
    from pyscf import df as pyscf_df
    from pyscf import scf as pyscf_scf
    from pyscf.mp.dfmp2 import DFMP2

    r = run(read_xyz(HI), RunOptions(basis="lanl2dz"))
    assert r.auxbasis == "def2-tzvpp-ri (H) + even-tempered (I)" and r.ecp["core_electrons"] == {"I": 46}
    assert any("even-tempered used for I (fallback)" in w for w in r.warnings)
    mol = molecule.build_molecule(read_xyz(HI), "lanl2dz")
    mf = pyscf_scf.RHF(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-9, 0
    mf.kernel()
    pt = DFMP2(mf)
    pt.with_df = pyscf_df.DF(mol, auxbasis=basis.default_auxbasis(mol, "mp2"))
    pt.verbose = 0
    pt.kernel()
    assert abs(r.e_hf - mf.e_tot) <= 1e-9 and abs(r.e_corr - pt.e_corr) <= 1e-9, (
        r.e_hf - mf.e_tot,
        r.e_corr - pt.e_corr,
    )
