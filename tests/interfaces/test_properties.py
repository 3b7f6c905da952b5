"""Densities and dipoles through the interfaces: the drop-in's make_rdm1 / make_natorbs / make_fno
with PySCF's conventions (against ``pyscf.mp.dfmp2_native``, ``dfump2_native`` and
``pyscf.mp.dfmp2.DFMP2.make_fno`` on the same mf and fitting set), QCSchema's
``scf_dipole_moment`` and ``mp2_dipole_moment`` (keywords.properties), and the ASE calculator's
``get_dipole_moment()`` in e·Å. Water/OH in cc-pVDZ or smaller."""

from pathlib import Path

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfmp2_native, dfump2, dfump2_native

import dfmp2
from dfmp2.errors import InputError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[2]
WATER = (ROOT / "inputs" / "water.xyz").read_text().split("\n", 2)[2]
OH = "O 0 0 0; H 0 0 0.97"
_mfs = {}


def _mf(atom: str, spin: int = 0):
    if (atom, spin) not in _mfs:
        mol = gto.M(atom=atom, basis="cc-pvdz", spin=spin, verbose=0)
        mf = (scf.UHF(mol) if spin else scf.RHF(mol)).density_fit()
        mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
        mf.kernel()
        _mfs[atom, spin] = mf
    return _mfs[atom, spin]


def test_make_rdm1_conventions_are_dfmp2_natives():
    mf = _mf(WATER)
    pt = dfmp2.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri")  # no kernel first, as dfmp2_native
    ref = dfmp2_native.DFMP2(mf, frozen=1, auxbasis="cc-pvdz-ri")
    dm = pt.make_rdm1(True)  # a bool first argument is `relaxed`, as dfmp2_native.make_rdm1(relaxed, ao_repr)
    assert dm.shape == (24, 24) and np.trace(dm) == pytest.approx(10.0, abs=1e-10)
    assert abs(dm - ref.make_rdm1(True)).max() <= 1e-6  # PySCF's CPHF stops near 1e-5 relative (test_densities)
    assert abs(pt.make_rdm1(relaxed=True, ao_repr=True) - mf.mo_coeff @ dm @ mf.mo_coeff.T).max() <= 1e-12
    assert abs(pt.make_rdm1() - ref.make_rdm1()).max() <= 1e-10
    active = pt.make_rdm1(with_frozen=False)  # the active block, as PySCF's mp2.make_rdm1(with_frozen=False)
    assert active.shape == (23, 23) and abs(active - pt.make_rdm1()[1:, 1:]).max() == 0.0


def test_natural_orbitals_equal_pyscf_natives():
    mf = _mf(WATER)
    pt, ref = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri"), dfmp2_native.DFMP2(mf, auxbasis="cc-pvdz-ri")
    S = mf.mol.intor("int1e_ovlp")
    for relaxed in (False, True):
        occ, no = pt.make_natorbs(relaxed=relaxed)
        occ_ref, no_ref = ref.make_natorbs(relaxed=relaxed)
        assert abs(occ - occ_ref).max() <= 1e-7, relaxed
        assert occ[0] >= occ[-1] and occ.sum() == pytest.approx(10.0, abs=1e-10)
        assert abs(no.T @ S @ no - np.eye(24)).max() <= 1e-10  # orthonormal natural orbitals
        assert abs(abs(np.diag(no[:, :5].T @ S @ no_ref[:, :5])) - 1.0).max() <= 1e-5  # the strongly occupied ones
    assert pt.make_natorbs(rdm1_mo=np.diag(np.r_[np.full(5, 2.0), np.zeros(19)]))[0][:5] == pytest.approx([2.0] * 5)
    with pytest.raises(InputError, match="rdm1_mo must be an MO density matrix"):
        pt.make_natorbs(rdm1_mo=[[1.0]])


def test_uhf_densities_and_natorbs_per_spin():
    mf = _mf(OH, spin=1)
    pt = dfmp2.DFMP2(mf, auxbasis="cc-pvdz-ri")
    ref = dfump2_native.DFUMP2(mf, auxbasis="cc-pvdz-ri")
    dm = pt.make_rdm1(relaxed=True)
    assert dm.shape == (2, 19, 19) and [np.trace(d) for d in dm] == pytest.approx([5.0, 4.0], abs=1e-10)
    assert abs(pt.make_rdm1() - ref.make_rdm1()).max() <= 1e-10
    occ, _ = pt.make_natorbs(relaxed=False)
    assert abs(occ - ref.make_natorbs(relaxed=False)[0]).max() <= 1e-10 and occ.sum() == pytest.approx(9.0)


@pytest.mark.parametrize("spin", [0, 1])
@pytest.mark.parametrize("kw", [dict(thresh=1e-4), dict(pct_occ=0.98), dict(nvir_act=6)])
def test_make_fno_is_pyscfs(spin, kw):
    """The frozen natural orbitals of PySCF's make_fno on our unrelaxed density: the same orbitals
    to freeze and the same NOs (each column up to its sign) as pyscf.mp.dfmp2.DFMP2's (UHF:
    dfump2.DFUMP2's), frozen core 1, both on the mf's fitting set."""
    mf = _mf(OH if spin else WATER, spin)
    ours = dfmp2.DFMP2(mf, frozen=1).make_fno(**kw)
    theirs = (dfump2.DFUMP2 if spin else pyscf_dfmp2.DFMP2)(mf, frozen=1).run().make_fno(**kw)
    S = mf.mol.intor("int1e_ovlp")
    pairs = zip(*ours, *theirs) if spin else [(*ours, *theirs)]
    for f1, c1, f2, c2 in pairs:
        assert list(f1) == list(f2) and len(f1) > 1
        assert abs(abs(np.diag(c1.T @ S @ c2)) - 1.0).max() <= 1e-8


def test_qcschema_dipole_moments():
    pytest.importorskip("qcelemental", reason="QCSchema path: qcelemental is not installed")
    from pyscf.lib.parameters import BOHR

    from dfmp2.interfaces.qcschema import run_atomic_input

    lines = WATER.strip().splitlines()
    doc = {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "energy",
        "model": {"method": "mp2", "basis": "6-31g"},
        "keywords": {"properties": ["dipole"]},
        "molecule": {
            "symbols": [ln.split()[0] for ln in lines],
            "geometry": [float(x) / BOHR for ln in lines for x in ln.split()[1:]],
        },
    }
    atomic, result = run_atomic_input(doc)
    dip = result.properties["dipole"]
    assert np.allclose(atomic.properties.scf_dipole_moment, dip["hf"]["au"], atol=1e-14, rtol=0)
    assert np.allclose(atomic.properties.mp2_dipole_moment, dip["relaxed"]["au"], atol=1e-14, rtol=0)
    assert abs(atomic.properties.mp2_dipole_moment[2]) > 0.5  # e*a0, QCSchema's unit (water: 0.8)
    plain, _ = run_atomic_input({**doc, "keywords": {}})
    assert plain.properties.scf_dipole_moment is None and plain.properties.mp2_dipole_moment is None
    with pytest.raises(InputError, match="unknown property 'octupole'") as e:
        run_atomic_input({**doc, "keywords": {"properties": ["octupole"]}})
    from dfmp2.interfaces.qcschema import error_line

    assert "keywords.properties" in error_line(e.value)


def test_ase_get_dipole_moment_in_e_angstrom():
    pytest.importorskip("ase", reason="the ASE calculator needs `pip install ase`")
    from ase.io import read
    from ase.units import Bohr

    from dfmp2.ase import DFMP2Calculator

    atoms = read(str(ROOT / "inputs" / "water.xyz"))
    atoms.calc = calc = DFMP2Calculator(basis="6-31g")
    e = atoms.get_potential_energy()
    run = calc.result
    mu = atoms.get_dipole_moment()  # the same run: the density stage on its reference, no SCF again
    assert calc.result is run and atoms.get_potential_energy() == e
    relaxed_au = np.array(run.properties["dipole"]["relaxed"]["au"])
    assert np.allclose(mu, relaxed_au * Bohr, atol=1e-14, rtol=0)
    # against the density stage on PySCF's DF-RHF with the same fitting sets (independent SCF)
    mol = gto.M(atom=WATER, basis="6-31g", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=run.jk_auxbasis)
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    ref = dfmp2_native.DFMP2(mf, auxbasis=run.auxbasis).make_rdm1(relaxed=True, ao_repr=True)
    ref_au = scf.hf.dip_moment(mol, ref, unit="AU", verbose=0)
    assert abs(mu / Bohr - ref_au).max() <= 1e-6
    calc.set(method="scs-mp2")  # another energy, another relaxed density: its dipole is computed
    mu_scs = atoms.get_dipole_moment()
    assert calc.result.properties["dipole"]["method"] == "scs-mp2" and abs(mu_scs - mu).max() > 1e-4
    atoms2 = read(str(ROOT / "inputs" / "water.xyz"))
    atoms2.calc = DFMP2Calculator(basis="6-31g", method="scs-mp2")
    atoms2.get_forces()
    assert np.allclose(atoms2.get_dipole_moment(), mu_scs, atol=1e-8, rtol=0)  # from the gradient's densities
