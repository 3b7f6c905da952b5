"""PySCF's frozen-natural-orbital round trip in the drop-in: ``DFMP2(mf, frozen=f, mo_coeff=no)``
with (f, no) from PySCF's own ``make_fno`` (a threshold that truncates the virtual space), against
PySCF's ``pyscf.mp.dfmp2.DFMP2`` / ``dfump2.DFUMP2`` on the same orbitals (1e-10 Eh). Orbitals
rotated within the occupied space: the energy of the canonical ones (invariance; PySCF's
canonical DF-MP2 the reference). Orbitals that leave the SCF's occupied space are refused."""

import numpy as np
import pytest
from pyscf import gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

import dfmp2
from dfmp2.errors import InputError

WATER = "O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477"
_MF = {}


def _mf(unrestricted: bool = False):
    if unrestricted not in _MF:
        if unrestricted:
            mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="cc-pvdz", spin=1, verbose=0)
            mf = scf.UHF(mol).density_fit()
        else:
            mol = gto.M(atom=WATER, basis="cc-pvdz", verbose=0)
            mf = scf.RHF(mol).density_fit()
        mf.conv_tol = 1e-11
        _MF[unrestricted] = mf.run()
    return _MF[unrestricted]


def test_fno_round_trip_rhf_equals_pyscf():
    mf = _mf()
    pt = pyscf_dfmp2.DFMP2(mf)
    pt.kernel()
    frozen, no = pt.make_fno(thresh=1e-3)
    assert len(frozen) >= 5  # the threshold truncates the virtual space
    theirs = pyscf_dfmp2.DFMP2(mf, frozen=frozen, mo_coeff=no)
    e_theirs, t2_theirs = theirs.kernel()
    ours = dfmp2.DFMP2(mf, frozen=frozen, mo_coeff=no).run()
    assert abs(ours.e_corr - e_theirs) <= 1e-10, (ours.e_corr, e_theirs)
    assert abs(ours.e_tot - theirs.e_tot) <= 1e-10
    assert abs(ours.e_corr_os - theirs.e_corr_os) <= 1e-10
    e, t2 = dfmp2.DFMP2(mf, frozen=frozen, mo_coeff=no).kernel()
    assert abs(e - e_theirs) <= 1e-10 and np.abs(t2 - t2_theirs).max() <= 1e-9
    assert not ours.warnings  # make_fno's orbitals are semi-canonical already
    # our own make_fno gives orbitals PySCF's DF-MP2 takes to the same number
    f2, no2 = dfmp2.DFMP2(mf).make_fno(thresh=1e-3)
    assert list(f2) == list(frozen)
    e2 = dfmp2.DFMP2(mf, frozen=f2, mo_coeff=no2).run().e_corr
    assert abs(e2 - pyscf_dfmp2.DFMP2(mf, frozen=f2, mo_coeff=no2).kernel(with_t2=False)[0]) <= 1e-10


@pytest.mark.heavy
def test_fno_round_trip_uhf_equals_pyscf():
    mf = _mf(unrestricted=True)
    pt = pyscf_dfump2.DFUMP2(mf)
    pt.kernel()
    frozen, no = pt.make_fno(thresh=1e-3)
    theirs = pyscf_dfump2.DFUMP2(mf, frozen=frozen, mo_coeff=no).run()
    ours = dfmp2.DFMP2(mf, frozen=frozen, mo_coeff=no).run()
    assert abs(ours.e_corr - theirs.e_corr) <= 1e-10 and abs(ours.e_tot - theirs.e_tot) <= 1e-10


def _rotated(C, i, j, t=0.3):
    c = C.copy()
    c[:, i], c[:, j] = np.cos(t) * C[:, i] + np.sin(t) * C[:, j], -np.sin(t) * C[:, i] + np.cos(t) * C[:, j]
    return c


def test_rotated_occupied_orbitals_give_the_canonical_energy():
    mf = _mf()
    ours = dfmp2.DFMP2(mf, frozen=1, mo_coeff=_rotated(mf.mo_coeff, 2, 3)).run()
    canonical = pyscf_dfmp2.DFMP2(mf, frozen=1).kernel(with_t2=False)[0]
    assert abs(ours.e_corr - canonical) <= 1e-9, (ours.e_corr, canonical)
    assert any("semi-canonical" in w for w in ours.warnings)
    with pytest.raises(InputError, match="canonical orbitals"):
        dfmp2.DFMP2(mf, frozen=1, mo_coeff=_rotated(mf.mo_coeff, 2, 3)).ao2mo()


def test_orbitals_outside_the_occupied_space_are_refused():
    mf = _mf()
    with pytest.raises(InputError, match="do not span the mf's occupied space"):
        dfmp2.DFMP2(mf, mo_coeff=_rotated(mf.mo_coeff, 4, 5)).run()
    with pytest.raises(InputError, match="do not fit"):
        dfmp2.DFMP2(mf, mo_coeff=mf.mo_coeff[:, :10]).run()
