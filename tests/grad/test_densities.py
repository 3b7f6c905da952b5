"""The MP2 one-particle densities (dfmp2.grad.relaxed, dfmp2.grad.densities) and the dipoles made
from them (dfmp2.props), against references that do not come from this program:

- PySCF's native DF-MP2 densities (``pyscf.mp.dfmp2_native.DFMP2.make_rdm1``, ``dfump2_native``)
  on the same density-fitted mf and the same MP2-fit set, unrelaxed and relaxed, in the AO basis.
  PySCF's own CPHF solver (``lib.krylov``) stops at a relative residual near 1e-5 whatever its
  ``cphf_tol`` (water/cc-pVDZ: 1.6e-6 absolute, which moves the relaxed density by 1.5e-7), so
  for the 1e-7 comparison PySCF's CPHF equations (its own Fock response, ``fock_response_rhf`` /
  ``_uhf``) are solved to 1e-13 by MINRES (``_tight_cphf``: the minimum-norm solution, which is
  also the answer where the UHF orbital Hessian is singular: OH's rotation about its axis); the
  dipoles are compared with PySCF's untouched ``make_rdm1`` and ``scf.hf.dip_moment`` (1e-5 D).
- Central differences of our own MP2 total energy (``dfmp2.DFMP2`` on a PySCF DF-UHF) in a
  uniform electric field added to PySCF's core Hamiltonian: the relaxed dipole is -dE/dF.
"""

import numpy as np
import pytest
import scipy.sparse.linalg
from gradient_fd import INPUTS
from pyscf import gto, scf
from pyscf.data.nist import AU2DEBYE
from pyscf.df import addons as df_addons
from pyscf.mp import dfmp2_native, dfump2_native

import dfmp2
from dfmp2 import linalg
from dfmp2.errors import InputError
from dfmp2.grad import plan as grad_plan
from dfmp2.grad import relaxed
from dfmp2.props.dipole import dipole_au, dipoles
from dfmp2.reference import from_pyscf

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small problems: one thread is faster

DENSITY_TOL = 1e-7  # AO basis, electrons: against PySCF's densities with its CPHF solved tightly
DIPOLE_TOL_D = 1e-5  # debye: against PySCF's untouched make_rdm1 + dip_moment
FD_TOL_AU = 1e-5  # e*bohr: the relaxed dipole against -dE/dF (measured: 1e-9)
MP2_FIT = "cc-pvdz-ri"


def _atoms(name: str) -> str:
    return (INPUTS / name).read_text().split("\n", 2)[2]


def _mf(atom: str, basis: str = "cc-pvdz", spin: int = 0, h1=None, conv_grad: float = 1e-9):
    """A converged PySCF DF-RHF (DF-UHF for spin > 0), JK-fit set PySCF's default; ``h1``: a core
    Hamiltonian in place of PySCF's (a field added)."""
    mol = gto.M(atom=atom, basis=basis, spin=spin, verbose=0)
    mf = (scf.UHF(mol) if spin else scf.RHF(mol)).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.max_cycle = 1e-12, conv_grad, 200
    if h1 is not None:
        mf.get_hcore = lambda *args: h1
    mf.kernel()
    assert mf.converged
    return mf


def _minres(apply, diag: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """x of diag x + apply(x) = rhs (a symmetric operator) by MINRES from 0, to 1e-13."""
    n = rhs.size
    A = scipy.sparse.linalg.LinearOperator((n, n), matvec=lambda x: diag * np.ravel(x) + apply(np.ravel(x)))
    x, info = scipy.sparse.linalg.minres(A, rhs, rtol=1e-13, maxiter=500)
    assert info == 0
    assert np.linalg.norm(A @ x - rhs) <= 1e-11 * np.linalg.norm(rhs)
    return x


def _rhf_cphf(mf, Lvo, max_cycle, tol, logger):
    """``dfmp2_native.solve_cphf_rhf``'s equations, (e_a - e_i) z + fvind(z) = -Lvo, solved tightly."""
    occ, e = mf.mo_occ > 0, mf.mo_energy
    diag = (e[~occ][:, None] - e[occ][None, :]).ravel()
    fvind = lambda x: dfmp2_native.fock_response_rhf(mf, x.reshape(Lvo.shape), full=False).ravel()
    return _minres(fvind, diag, -Lvo.ravel()).reshape(Lvo.shape)


def _uhf_cphf(mf, Lvo, max_cycle, tol, logger):
    """``dfump2_native.solve_cphf_uhf``'s coupled equations, solved tightly."""
    shapes, n0 = [x.shape for x in Lvo], Lvo[0].size
    diag = np.concatenate([(e[o == 0][:, None] - e[o > 0][None, :]).ravel() for e, o in zip(mf.mo_energy, mf.mo_occ)])

    def fvind(x):
        z = [x[:n0].reshape(shapes[0]), x[n0:].reshape(shapes[1])]
        return np.concatenate([r.ravel() for r in dfump2_native.fock_response_uhf(mf, z, full=False)])

    x = _minres(fvind, diag, -np.concatenate([x.ravel() for x in Lvo]))
    return [x[:n0].reshape(shapes[0]), x[n0:].reshape(shapes[1])]


@pytest.fixture
def _tight_cphf(monkeypatch):
    monkeypatch.setattr(dfmp2_native, "solve_cphf_rhf", _rhf_cphf)
    monkeypatch.setattr(dfump2_native, "solve_cphf_uhf", _uhf_cphf)


def _pyscf_dipole_d(mf, dm_ao) -> np.ndarray:
    return scf.hf.dip_moment(mf.mol, dm_ao, unit="Debye", verbose=0)


RHF_CASES = {  # name: (input, frozen)
    "water": ("water.xyz", None),
    "water-frozen-core": ("water.xyz", 1),
    "formaldehyde": ("formaldehyde.xyz", None),
}
_rhf_cache = {}


def _rhf_case(name):
    if name not in _rhf_cache:
        xyz, frozen = RHF_CASES[name]
        mf = _mf(_atoms(xyz))
        pt = dfmp2.DFMP2(mf, frozen=frozen, auxbasis=MP2_FIT)
        _rhf_cache[name] = (mf, frozen, pt.densities(relaxed=True))
    return _rhf_cache[name]


@pytest.mark.parametrize("name", sorted(RHF_CASES))
def test_rhf_densities_equal_pyscf_native(name, _tight_cphf):
    mf, frozen, dens = _rhf_case(name)
    ref = dfmp2_native.DFMP2(mf, frozen=frozen, auxbasis=MP2_FIT)
    for kind in ("unrelaxed", "relaxed"):
        theirs = ref.make_rdm1(relaxed=kind == "relaxed", ao_repr=True)
        assert abs(dens.total_ao(kind) - theirs).max() <= DENSITY_TOL, kind
    if frozen:  # the frozen-active block of the relaxed density is there, and the unrelaxed one has none
        C, P = dens.mo_coeff[0], dens.relaxed[0]
        assert abs(P[0, 1:5]).max() > 1e-4 and abs(dens.unrelaxed[0][0, 1:]).max() == 0.0
        assert C.shape[1] == P.shape[0]
    tr = [np.trace(d) for d in (dens.hf()[0], dens.unrelaxed[0], dens.relaxed[0])]
    assert tr == pytest.approx([mf.mol.nelectron] * 3, abs=1e-10)  # the correlation part is traceless


@pytest.mark.parametrize("name", sorted(RHF_CASES))
def test_rhf_dipoles_equal_pyscf_dip_moment(name):
    """Our HF, unrelaxed and relaxed dipoles (debye, origin 0) against PySCF's dip_moment of its own
    densities, its CPHF as it is."""
    mf, frozen, dens = _rhf_case(name)
    ref = dfmp2_native.DFMP2(mf, frozen=frozen, auxbasis=MP2_FIT)
    ours = dipoles(mf.mol, dens)
    assert abs(ours.debye("hf") - _pyscf_dipole_d(mf, mf.make_rdm1())).max() <= 1e-9
    for kind in ("unrelaxed", "relaxed"):
        theirs = _pyscf_dipole_d(mf, ref.make_rdm1(relaxed=kind == "relaxed", ao_repr=True))
        assert abs(ours.debye(kind) - theirs).max() <= DIPOLE_TOL_D, kind
    assert abs(ours.relaxed - ours.unrelaxed).max() > 1e-3  # the response is there (water: 0.029 e*bohr)


def test_uhf_densities_equal_pyscf_native_frozen_core(_tight_cphf):
    mf = _mf("O 0 0 0; H 0 0 0.97", spin=1)
    dens = dfmp2.DFMP2(mf, frozen=1, auxbasis=MP2_FIT).densities(relaxed=True)
    ref = dfump2_native.DFUMP2(mf, frozen=1, auxbasis=MP2_FIT)
    for kind in ("unrelaxed", "relaxed"):
        theirs = ref.make_rdm1(relaxed=kind == "relaxed", ao_repr=True)  # (2, nao, nao)
        assert abs(np.stack(dens.ao(kind)) - theirs).max() <= DENSITY_TOL, kind
    assert [np.trace(d) for d in dens.relaxed] == pytest.approx([5.0, 4.0], abs=1e-10)


def test_uhf_relaxed_dipole_is_the_field_derivative_of_our_mp2_energy():
    """OH (doublet, its axis off every Cartesian axis), cc-pVDZ: the relaxed dipole of our DF-UMP2
    (MP2 fit: the mf's own set, the drop-in's default) against -dE/dF of our DF-UMP2 total energy,
    F a field added to PySCF's core Hamiltonian (origin 0), fourth-order central differences of
    step 5e-4 a.u. (its error ~1e-10). The SCF in a field converged to an orbital gradient of
    1e-8 (its energy error is quadratic in that)."""
    atom = "O 0 0 0; H 0 0.3 0.97"
    mf0 = _mf(atom, spin=1)
    mol = mf0.mol
    with mol.with_common_orig((0, 0, 0)):
        r = mol.intor_symmetric("int1e_r", comp=3)
    h0 = mf0.get_hcore()
    dens = dfmp2.DFMP2(mf0).densities(relaxed=True)
    mu = dipoles(mol, dens)
    step = 5e-4

    def energy(f, k):
        mf = _mf(atom, spin=1, h1=h0 + f * r[k], conv_grad=1e-8)
        return dfmp2.DFMP2(mf).run().e_tot

    nuclear = np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords())
    for k in (1, 2):
        e = [energy(s * step, k) for s in (1, -1, 2, -2)]
        dEdF = (8 * (e[0] - e[1]) - (e[2] - e[3])) / (12 * step)
        assert abs(mu.relaxed[k] - (nuclear[k] - dEdF)) <= FD_TOL_AU, (k, mu.relaxed[k], nuclear[k] - dEdF)
    assert abs(mu.relaxed - mu.unrelaxed).max() > 1e-3
    assert abs(mu.relaxed[0]) <= 1e-10  # the molecule lies in the yz plane


def test_the_gradient_records_the_same_densities():
    """GradientParts.densities (the gradient stage's own P) equals the density stage's, frozen
    core included: one piece of code, two entries."""
    mf, frozen, dens = _rhf_case("water-frozen-core")
    parts = dfmp2.DFMP2(mf, frozen=frozen, auxbasis=MP2_FIT).nuc_grad_method()
    parts.kernel()
    g = parts.parts.densities
    for kind in ("unrelaxed", "relaxed"):
        assert abs(g.mo(kind)[0] - dens.mo(kind)[0]).max() <= 1e-10, kind
    assert g.zvector["iterations"] > 0 and g.restricted


def test_unrelaxed_density_takes_frozen_virtuals_and_the_relaxed_one_refuses_them():
    mf, _, _ = _rhf_case("water")
    ref = from_pyscf(mf, [0, 5])  # index 5: the LUMO
    be = linalg.get_backend("cpu")
    aux = df_addons.make_auxmol(mf.mol, MP2_FIT)
    d = relaxed.density_stage(mf.mol, ref, aux, None, be, relaxed=False)
    assert d.relaxed is None and abs(d.unrelaxed[0][5]).max() == 0.0  # row 5 untouched
    assert abs(d.unrelaxed[0][6:, 6:] - np.diag(np.diag(d.unrelaxed[0][6:, 6:]))).max() > 1e-6
    with pytest.raises(InputError, match="frozen virtual orbitals"):
        relaxed.density_stage(mf.mol, ref, aux, mf.with_df.auxmol, be, relaxed=True)
    with pytest.raises(ValueError, match="relaxed density was not computed"):
        d.mo("relaxed")


def test_density_stage_memory_is_refused_in_one_line():
    from dfmp2.errors import MemoryLimitError

    shapes = dict(nao=500, nocc=40, nact=40, nvir=460, naux_mp2=1500, naux_jk=1800)
    with pytest.raises(MemoryLimitError, match="the density stage needs about"):
        grad_plan.choose_plan(shapes, 10.0, phases=grad_plan.DENSITY_PHASES, stage="density")
    full = grad_plan.choose_plan(shapes, 1e9)
    dens = grad_plan.choose_plan(shapes, 1e9, phases=grad_plan.DENSITY_PHASES)
    assert set(dens.phases) == set(grad_plan.DENSITY_PHASES) and dens.peak_mb <= full.peak_mb


def test_dipole_au_is_pyscf_dip_moment_in_atomic_units():
    mf, _, _ = _rhf_case("formaldehyde")
    ours = dipole_au(mf.mol, mf.make_rdm1())
    theirs = scf.hf.dip_moment(mf.mol, mf.make_rdm1(), unit="AU", verbose=0)
    assert abs(ours - theirs).max() <= 1e-12
    assert abs(ours * AU2DEBYE - _pyscf_dipole_d(mf, mf.make_rdm1())).max() <= 1e-10


@pytest.mark.cuda
def test_density_stage_on_cuda_equals_cpu():
    """The density stage on a CUDA backend (its GEMMs and J/K there, fp64) against the CPU's, RHF
    frozen core and UHF, on the same PySCF orbitals."""
    for atom, spin, frozen in ((_atoms("water.xyz"), 0, 1), ("O 0 0 0; H 0 0 0.97", 1, None)):
        mf = _mf(atom, spin=spin)
        cpu = dfmp2.DFMP2(mf, frozen=frozen).densities(relaxed=True)
        gpu = dfmp2.DFMP2(mf, frozen=frozen, device="cuda").densities(relaxed=True)
        assert gpu.ran["device"].startswith("cuda") and gpu.ran["kernels"]
        for kind in ("unrelaxed", "relaxed"):
            assert abs(np.stack(gpu.mo(kind)) - np.stack(cpu.mo(kind))).max() <= 1e-9, (spin, kind)
