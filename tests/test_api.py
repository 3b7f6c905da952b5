"""The Python API (issue 17): dfmp2.DFMP2(mf) as a drop-in for pyscf.mp.dfmp2.DFMP2 on the same
converged RHF (compared with PySCF's own DFMP2 given the same MP2-fit basis), and dfmp2.energy()."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from pyscf import df, dft, gto
from pyscf import scf as pyscf_scf
from pyscf.mp.dfmp2 import DFMP2 as PySCFDFMP2

import dfmp2
from dfmp2.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
WATER = "O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477"


def converged_rhf(atom, basis="cc-pvdz", density_fit=True, **kw):
    mol = gto.M(atom=atom, basis=basis, verbose=0, **kw)
    mf = pyscf_scf.RHF(mol)
    if density_fit:
        mf = mf.density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    assert mf.converged
    return mf


def pyscf_dfmp2(mf, frozen, auxbasis):
    pt = PySCFDFMP2(mf, frozen=frozen)
    pt.with_df = df.DF(mf.mol, auxbasis=auxbasis)
    pt.verbose = 0
    pt.kernel()
    return pt


@pytest.mark.parametrize("atom, basis, density_fit, frozen, auxbasis, kw", [
    (WATER, "cc-pvdz", True, None, None, {}),                                  # DF-RHF, default aux
    ("N 0 0 0.1; H 0 0.94 -0.27; H 0.81 -0.47 -0.27; H -0.81 -0.47 -0.27", "cc-pvdz", False, 1,
     "cc-pvdz-ri", {}),                                                        # exact RHF, frozen int
    ("Cl 0 0 0.071; H 0 0 -1.207", "cc-pvdz", True, [0, 1, 2, 3, 4, 22], "def2-tzvpp-ri", {}),   # list, a virtual too
    ("H 0 0 0; I 0 0 1.6092", "def2-svp", True, [0, 1, 2, 3], None, {"ecp": "def2-svp"}),         # an ECP on mf.mol
])
def test_drop_in_matches_pyscf_dfmp2_on_the_same_mf(atom, basis, density_fit, frozen, auxbasis, kw):
    mf = converged_rhf(atom, basis, density_fit, **kw)
    pt = dfmp2.DFMP2(mf, frozen=frozen, auxbasis=auxbasis).run()
    # PySCF with the MP2-fit basis ours used (its own default on a DF mf would be the JK-fit one)
    aux = auxbasis or dfmp2.scf.default_auxbasis(mf.mol, "mp2")
    ref = pyscf_dfmp2(mf, frozen, aux)
    for name in ("e_corr", "e_corr_os", "e_corr_ss", "e_tot", "emp2", "emp2_scs", "e_tot_scs"):
        assert abs(getattr(pt, name) - getattr(ref, name)) <= 1e-10, (name, getattr(pt, name) - getattr(ref, name))
    assert pt.e_hf == mf.e_tot and pt.e_corr < -1e-3
    assert pt.e_corr_sos == pytest.approx(1.3 * ref.e_corr_os, abs=1e-12)
    assert pt.ran["device"] == "cpu" and pt.ran["precision"] == "fp64" and pt.naux > 0
    assert (pt.nocc, pt.nmo) == (ref.nocc, ref.nmo)                   # active counts, as PySCF's
    assert bool(pt.warnings) == (kw.get("ecp") is not None)           # AutoAux for I is stated


def test_kernel_returns_e_corr_and_no_amplitudes():
    mf = converged_rhf(WATER)
    e, t2 = dfmp2.DFMP2(mf).kernel()
    assert t2 is None and e == pytest.approx(pyscf_dfmp2(mf, None, "cc-pvdz-ri").e_corr, abs=1e-10)


@pytest.mark.parametrize("frozen", [None, 1])
def test_uhf_reference_runs_dfump2_like_pyscf(frozen):
    """A converged PySCF DF-UHF (OH, doublet): DFMP2(mf) runs our DF-UMP2 on its orbitals and
    matches PySCF's DFUMP2 on the same mf with the same MP2-fit basis to 1e-10 Eh."""
    from pyscf.mp.dfump2 import DFUMP2
    mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
    mf = pyscf_scf.UHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    assert mf.converged
    ours = dfmp2.DFMP2(mf, frozen=frozen).run()
    ref = DFUMP2(mf, frozen=frozen)
    ref.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    ref.kernel()
    assert abs(ours.e_corr - ref.e_corr) <= 1e-10, (ours.e_corr, ref.e_corr)
    assert abs(ours.e_tot - ref.e_tot) <= 1e-10


def test_refusals_are_one_clear_error():
    mol = gto.M(atom=WATER, basis="sto-3g", verbose=0)
    unconverged = pyscf_scf.RHF(mol)
    unconverged.max_cycle = 1
    unconverged.kernel()
    assert not unconverged.converged
    with pytest.raises(InputError, match="has not converged"):
        dfmp2.DFMP2(unconverged).run()
    with pytest.raises(InputError, match="has not converged"):
        dfmp2.DFMP2(pyscf_scf.RHF(mol)).run()                       # never run
    oh = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="sto-3g", spin=1, verbose=0)
    with pytest.raises(InputError, match="ROHF.* is not supported"):
        dfmp2.DFMP2(pyscf_scf.ROHF(oh).run()).run()
    with pytest.raises(InputError, match="Kohn-Sham"):
        dfmp2.DFMP2(dft.RKS(mol).run()).run()
    with pytest.raises(InputError, match="PySCF SCF object"):
        dfmp2.DFMP2("mf").run()
    mf = pyscf_scf.RHF(mol).run()
    for frozen, msg in ((5, "between 0 and 4"), (-1, "between 0 and 4"), ([0, 0], "distinct"),
                        ([7], "within 0..6"), ([0.5], "list of orbital indices"), (True, "None, an int"),
                        ([0, 1, 2, 3, 4], "0 active occupied"), ([5, 6], "0 virtual")):
        with pytest.raises(InputError, match=msg):
            dfmp2.DFMP2(mf, frozen=frozen).run()
    with pytest.raises(InputError, match="unknown device|device"):
        dfmp2.DFMP2(mf, device="tpu").run()


def test_energy_from_an_xyz_file_and_a_mole_give_the_reference():
    ref = json.loads((ROOT / "inputs" / "references.json").read_text())["references"]["water|cc-pvdz|cc-pvdz-ri|df|ae"]
    r = dfmp2.energy(str(ROOT / "inputs" / "water.xyz"))
    assert abs(r.e_corr - ref["e_corr"]) <= 1e-9 and abs(r.e_hf - ref["e_hf"]) <= 1e-9
    lines = (ROOT / "inputs" / "water.xyz").read_text().splitlines()[2:]
    mol = gto.M(atom="\n".join(lines), basis="cc-pvdz", unit="Angstrom", verbose=0)
    m = dfmp2.energy(mol)
    assert abs(m.e_corr - r.e_corr) <= 1e-10 and abs(m.e_hf - r.e_hf) <= 1e-10
    assert (m.nbasis, m.naux, m.basis) == (r.nbasis, r.naux, "cc-pvdz")
    bohr = gto.M(atom=[(mol.atom_symbol(i), tuple(mol.atom_coords(unit="Bohr")[i])) for i in range(mol.natm)],
                 unit="Bohr", basis="cc-pvdz", verbose=0)
    assert abs(dfmp2.energy(bohr, frozen_core=True).e_hf - r.e_hf) <= 1e-9      # units carried over


def test_energy_of_a_mole_with_its_basis_ecp_matches_the_ecp_reference():
    ref = json.loads((ROOT / "inputs" / "references_ecp.json").read_text())["references"]["hydrogen_iodide|def2-svp|fc"]
    mol = gto.M(atom="H 0 0 0; I 0 0 1.6092", basis="def2-svp", ecp="def2-svp", verbose=0)
    r = dfmp2.energy(mol, frozen_core=True)
    assert r.ecp["elements"] == ["I"] and r.nfrozen == 4
    assert abs(r.e_corr - ref["e_corr"]) <= 1e-9 and abs(r.e_hf - ref["e_hf"]) <= 1e-9


def test_energy_refusals():
    with pytest.raises(InputError, match="unknown option.*nonsense"):
        dfmp2.energy("water.xyz", nonsense=1)
    with pytest.raises(InputError, match="no such file"):
        dfmp2.energy("/nonexistent/water.xyz")
    with pytest.raises(InputError, match="XYZ file path or a pyscf.gto.Mole"):
        dfmp2.energy(42)
    with pytest.raises(InputError, match="not one basis name"):
        dfmp2.energy(gto.M(atom=WATER, basis={"O": "cc-pvdz", "H": "sto-3g"}, verbose=0))
    with pytest.raises(InputError, match="not the ECP of its basis"):
        dfmp2.energy(gto.M(atom="H 0 0 0; I 0 0 1.61", basis="def2-svp", ecp="lanl2dz", verbose=0))


def test_import_stays_light():
    """``import dfmp2`` does not import torch or PySCF; the API loads on first use."""
    code = "import sys, dfmp2; print('torch' in sys.modules, 'pyscf' in sys.modules, callable(dfmp2.energy))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=ROOT).stdout.split()
    assert out == ["False", "False", "True"]
