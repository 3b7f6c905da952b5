"""Every ``frozen`` form PySCF's DF-MP2 classes take: an int, a list of orbital
indices (occupied or virtual, negative from the top, repeats), and for a UHF a pair of per-spin
lists. References: PySCF's own ``pyscf.mp.dfmp2.DFMP2`` / ``pyscf.mp.dfump2.DFUMP2`` on the same
density-fitted mf, with the same ``frozen``, drawn at random (hypothesis); anything else is one
InputError line."""

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from pyscf import gto, scf
from pyscf.mp import dfmp2 as pyscf_dfmp2
from pyscf.mp import dfump2 as pyscf_dfump2

import dfmp2
from dfmp2.errors import InputError

_MF = {}


def _mf(unrestricted: bool):
    """Water (RHF) or OH (UHF) in 6-31G, PySCF's DF-SCF, converged once per session."""
    if unrestricted not in _MF:
        if unrestricted:
            mol = gto.M(atom="O 0 0 0; H 0 0 0.97", basis="6-31g", spin=1, verbose=0)
            mf = scf.UHF(mol).density_fit()
        else:
            mol = gto.M(atom="O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="6-31g", verbose=0)
            mf = scf.RHF(mol).density_fit()
        mf.conv_tol = 1e-12
        _MF[unrestricted] = mf.run()
    return _MF[unrestricted]


def _index_lists(nmo):
    return st.lists(st.integers(-nmo, nmo - 1), max_size=5)


def _forms(nmo, nocc, unrestricted):
    single = st.one_of(st.none(), st.integers(0, nocc - 1), _index_lists(nmo), _index_lists(nmo).map(tuple))
    single = single | _index_lists(nmo).map(np.array)
    if not unrestricted:
        return single
    return single | st.tuples(_index_lists(nmo), _index_lists(nmo))


def _active(mf, frozen):
    """(active occupied, active virtual) per spin under PySCF's reading of ``frozen``."""
    pt = (pyscf_dfump2.DFUMP2 if mf.mo_occ.ndim == 2 else pyscf_dfmp2.DFMP2)(mf, frozen=frozen)
    masks = pt.get_frozen_mask()
    masks = masks if mf.mo_occ.ndim == 2 else [masks]
    occs = mf.mo_occ if mf.mo_occ.ndim == 2 else [mf.mo_occ]
    return [(int(np.sum(m & (o > 0))), int(np.sum(m & (o == 0)))) for m, o in zip(masks, occs)]


@pytest.mark.parametrize("unrestricted", [False, True], ids=["rhf", "uhf"])
def test_every_pyscf_frozen_form_gives_pyscfs_energy(unrestricted):
    mf = _mf(unrestricted)
    nmo = mf.mo_coeff.shape[-1]
    nocc = int(np.sum(mf.mo_occ[0] > 0)) if unrestricted else int(np.sum(mf.mo_occ > 0))
    ref_cls = pyscf_dfump2.DFUMP2 if unrestricted else pyscf_dfmp2.DFMP2

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
    @given(_forms(nmo, nocc, unrestricted))
    def check(frozen):
        active = _active(mf, frozen)
        assume(all(o > 0 and v > 0 for o, v in active))  # something to correlate in every spin
        ref = ref_cls(mf, frozen=frozen).run()
        ours = dfmp2.DFMP2(mf, frozen=frozen).run()
        assert abs(ours.e_corr - ref.e_corr) < 1e-10, (frozen, ours.e_corr, ref.e_corr)
        assert (ours.nocc, ours.nmo) == (ref.nocc, ref.nmo)

    check()


@pytest.mark.parametrize(
    "unrestricted, frozen",
    [
        (False, ([0], [0])),  # per-spin lists on an RHF
        (True, ([0], [0], [1])),  # three spins
        (True, (1, [0])),  # a per-spin item that is not a list
        (False, 5),  # every occupied orbital
        (False, -1),
        (False, [13]),  # past nmo
        (False, "1"),
        (False, [0.5]),
        (False, True),
    ],
)
def test_other_frozen_forms_are_one_line(unrestricted, frozen):
    with pytest.raises(InputError) as e:
        dfmp2.DFMP2(_mf(unrestricted), frozen=frozen).run()
    assert "\n" not in str(e.value) and "frozen" in str(e.value)
