"""Default fitting sets: a basis given per element (a dict, as PySCF's own tests write
``mol.basis``) gets the sets PySCF's ``make_auxbasis`` matches per element, not the fallback for
all; beyond Kr the published sets PySCF's files lack come from the Basis Set Exchange package
(def2-SVP-RIFIT for I in def2-SVP), named in the result; an element no published set has still
gets AutoAux, stated. References are PySCF's own DF-MP2 with the auxiliary bases spelled out here
(the BSE set for I read with the BSE package's API and ``gto.basis.parse``), never this program's
numbers. Energies in Hartree."""

import json
import sys
import warnings
from pathlib import Path

import basis_set_exchange
import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from pyscf import df, gto
from pyscf import scf as pyscf_scf
from pyscf.df.addons import make_auxbasis
from pyscf.mp import dfmp2 as pyscf_dfmp2

import dfmp2
from dfmp2.cli.main import main
from dfmp2.df import basis as df_basis
from dfmp2.errors import InputError
from dfmp2.io import molecule
from dfmp2.io.xyz import parse_xyz
from dfmp2.scf import pyscf_scf as bridge

ROOT = Path(__file__).resolve().parents[2]
HI = ROOT / "inputs" / "ecp" / "hydrogen_iodide.xyz"
WATER = "O 0.0 0.0 0.119; H 0.0 0.757 -0.477; H 0.0 -0.757 -0.477"
HI_ATOMS = "H 0 0 0; I 0 0 1.6092"
TOL = 1e-9


def mole(atom, basis, **kw):
    return gto.M(atom=atom, basis=basis, unit="Angstrom", verbose=0, **kw)


def tight_rhf(mol, density_fit=None):
    """PySCF's RHF (``density_fit``: its JK-fit set) converged to the program's thresholds."""
    mf = pyscf_scf.RHF(mol)
    if density_fit:
        mf = mf.density_fit(auxbasis=density_fit)
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = bridge.SCF_CONV_TOL, bridge.SCF_CONV_TOL_GRAD, 0
    mf.kernel()
    assert mf.converged
    return mf


def per_atom(mol, spec):
    """{atom label: set} of an auxiliary-basis dict keyed by element or label."""
    return {a[0]: spec.get(a[0], spec.get(molecule.element(mol, i))) for i, a in enumerate(mol._atom)}


def bse_shells(name, el):
    """The set ``name`` for element ``el`` as the BSE package publishes it, in PySCF's format."""
    return gto.basis.parse(basis_set_exchange.get_basis(name, elements=[el], fmt="nwchem"), el)


def geometry(atoms):
    lines = atoms.strip().splitlines()
    return parse_xyz(f"{len(lines)}\n\n" + "\n".join(lines) + "\n", "mol.xyz")


# --- a basis per element ------------------------------------------------------------------
@pytest.mark.parametrize(
    "basis",
    [
        {"H": "cc-pvdz", "O": "cc-pvdz"},  # PySCF's own tests write it so
        {"O": "cc-pvdz", "H": "def2-svp"},  # two orbital bases, two matched sets
        {"default": "cc-pvdz", "H1": "def2-svp"},  # a label and PySCF's 'default'
        {"O": "6-31g**", "H": "cc-pvtz"},  # the Pople stem per element
    ],
)
def test_dict_basis_default_is_pyscfs_choice_per_element(basis):
    atom = WATER.replace("H 0.0 0.757", "H1 0.0 0.757") if "H1" in basis else WATER
    mol = mole(atom, basis)
    for kind, mp2fit in (("mp2", True), ("jk", False)):
        ours = df_basis.default_auxbasis(mol, kind)
        assert per_atom(mol, ours) == make_auxbasis(mol, mp2fit=mp2fit), (kind, ours)
        assert df_basis.auxbasis_note(mol, ours, kind) is None  # matched: nothing to say
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pyscf_naux = df.addons.make_auxmol(mol, make_auxbasis(mol, mp2fit=mp2fit)).nao_nr()
        assert df_basis.make_auxmol(mol, ours).nao_nr() == pyscf_naux


def test_dict_basis_drop_in_matches_pyscf_dfmp2_on_a_non_df_rhf():
    """PySCF's DFMP2 on a non-DF mf fits with make_auxbasis(mp2fit=True): cc-pVDZ-RI per element.
    The def2-TZVPP-RI this program used for a dict basis moved E_corr by 3.2e-5 Eh."""
    mol = mole(WATER, {"H": "cc-pvdz", "O": "cc-pvdz"})
    mf = tight_rhf(mol)
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.verbose = 0
    ref.kernel()
    pt = dfmp2.DFMP2(mf).run()
    assert pt.auxbasis in ("cc-pvdz-ri", {"H": "cc-pvdz-ri", "O": "cc-pvdz-ri"}) and pt.warnings == []
    assert abs(pt.e_corr - ref.e_corr) <= TOL, pt.e_corr - ref.e_corr


def test_energy_of_a_mole_with_one_basis_per_element_matches_pyscf():
    """dfmp2.energy(mol) takes a per-element dict that names one basis for every atom as that
    basis (it refused it before); the whole run against PySCF's DF-RHF + DF-MP2."""
    mol = mole(WATER, {"H": "cc-pvdz", "O": "cc-pvdz"})
    r = dfmp2.energy(mol)
    assert r.auxbasis == "cc-pvdz-ri" and r.jk_auxbasis == "cc-pvdz-jkfit"
    mf = tight_rhf(mol, density_fit="cc-pvdz-jkfit")
    ref = pyscf_dfmp2.DFMP2(mf)
    ref.with_df, ref.verbose = df.DF(mol, auxbasis="cc-pvdz-ri"), 0
    ref.kernel()
    assert abs(r.e_hf - mf.e_tot) <= TOL and abs(r.e_corr - ref.e_corr) <= TOL, (
        r.e_hf - mf.e_tot,
        r.e_corr - ref.e_corr,
    )


# --- beyond Kr: the Basis Set Exchange's published sets -----------------------------------
def hi_reference(frozen=None):
    """(E_HF, E_corr) of HI/def2-SVP (def2 ECP on I) from PySCF: DF-RHF with def2-universal-jkfit,
    DF-MP2 with def2-SVP-RI on H and the BSE package's def2-SVP-RIFIT on I."""
    mol = mole(HI_ATOMS, "def2-svp", ecp="def2-svp")
    mf = tight_rhf(mol, density_fit="def2-universal-jkfit")
    pt = pyscf_dfmp2.DFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mol, auxbasis={"H": "def2-svp-ri", "I": bse_shells("def2-SVP-RIFIT", "I")})
    pt.verbose = 0
    pt.kernel()
    return mf, pt


def test_hi_def2_svp_fits_iodine_with_the_published_def2_svp_rifit(tmp_path):
    out = tmp_path / "hi.json"
    res = CliRunner().invoke(main, ["run", str(HI), "--basis", "def2-svp", "--json", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["auxbasis"] == "def2-svp-ri (H) + def2-svp-rifit (I)"
    note = [w for w in d["warnings"] if "def2-svp-rifit used for I" in w]
    assert len(note) == 1 and f"Basis Set Exchange, basis-set-exchange {basis_set_exchange.version()}" in note[0]
    assert "def2-svp-rifit" in " ".join(res.output.split())  # the table names it too
    mf, ref = hi_reference()
    assert abs(d["energies"]["e_hf"] - mf.e_tot) <= TOL, d["energies"]["e_hf"] - mf.e_tot
    assert abs(d["energies"]["e_corr"] - ref.e_corr) <= TOL, d["energies"]["e_corr"] - ref.e_corr


def test_hi_drop_in_on_pyscfs_mf_uses_the_bse_set_and_matches_pyscf():
    """The drop-in on a DF mf fits with the mf's JK-fit set, as PySCF's DFMP2 does; given the
    CLI's default MP2 fit (df_basis.mp2_auxbasis: the BSE's def2-SVP-RIFIT for I) it matches PySCF
    with the same sets."""
    mf, ref = hi_reference(frozen=[0, 1, 2, 3])
    aux = df_basis.mp2_auxbasis(mf.mol)
    assert aux == {"H": "def2-svp-ri", "I": "def2-svp-rifit"}
    pt = dfmp2.DFMP2(mf, frozen=[0, 1, 2, 3], auxbasis=aux).run()
    assert abs(pt.e_corr - ref.e_corr) <= TOL, pt.e_corr - ref.e_corr


def test_the_bse_set_is_the_one_the_bse_package_publishes():
    """PySCF's loader reads 'def2-svp-rifit' through the BSE package: the same shells as the
    package's own NWChem text parsed by PySCF (30 shells on I, 0 in PySCF's own def2-svp-ri)."""
    assert df_basis.from_bse("def2-svp-rifit") and df_basis.from_bse("cc-pvdz-pp-rifit")
    assert not df_basis.from_bse("def2-svp-ri") and not df_basis.from_bse("def2-universal-jkfit")
    loaded = gto.basis.load("def2-svp-rifit", "I")
    assert sorted(map(str, loaded)) == sorted(map(str, bse_shells("def2-SVP-RIFIT", "I")))


def test_element_no_published_set_has_still_gets_autoaux_with_the_warning():
    """cc-pVDZ-PP on I: its RI set in the BSE (cc-pVDZ-PP-RIFIT) stops at Pt and skips I, and
    def2-TZVPP-RI (PySCF's) lacks I too: AutoAux, named in the warning."""
    with pytest.raises(KeyError):
        basis_set_exchange.get_basis("cc-pvdz-pp-rifit", elements=["I"])
    mol = mole(HI_ATOMS, {"H": "cc-pvdz", "I": "cc-pvdz-pp"}, ecp={"I": "cc-pvdz-pp"})
    spec = df_basis.default_auxbasis(mol, "mp2")
    assert spec == {"H": "cc-pvdz-ri", "I": "autoaux"}
    note = df_basis.auxbasis_note(mol, spec, "mp2")
    assert "autoaux used for I (fallback)" in note and "Basis Set Exchange" not in note
    # an all-electron iodine never gets the ECP-made def2-SVP-RIFIT
    ae = mole(HI_ATOMS, "def2-svp")
    assert df_basis.default_auxbasis(ae, "mp2")["I"] == "autoaux"


def test_a_missing_bse_package_is_one_error_line_not_autoaux(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "basis_set_exchange", None)  # import fails
    assert df_basis.bse_version() is None
    with pytest.raises(
        InputError, match=r"def2-svp-rifit, published in the Basis Set Exchange.*pip install basis-set-exchange"
    ):
        df_basis.default_auxbasis(mole(HI_ATOMS, "def2-svp", ecp="def2-svp"), "mp2")
    res = CliRunner().invoke(main, ["run", str(HI), "--basis", "def2-svp"])
    assert_one_line_error(res, "pip install basis-set-exchange")
    # nothing through Kr needs it
    assert df_basis.default_auxbasis(mole(WATER, "6-31g**"), "mp2") == {"O": "cc-pvdz-ri", "H": "cc-pvdz-ri"}


def test_basis_whose_ecp_pyscf_does_not_attach_is_refused():
    """With the BSE package installed PySCF's loader reads def2-SVP for Ce (its file stops before
    the lanthanides) from the BSE without the ECP it is made for; run all-electron it would be
    meaningless, so it is one error before any integral."""
    g = geometry("Ce 0 0 0\nH 0 0 2.0")
    with pytest.raises(InputError, match="basis def2-svp for Ce is made for an effective core potential"):
        molecule.build_molecule(g, "def2-svp", multiplicity=2)
