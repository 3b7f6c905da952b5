"""The relaxed double-hybrid dipole (dfmp2.grad.dh.dh_densities, dfmp2.props) against references
that do not come from it: central differences of our own double-hybrid energy (``dfmp2 run
--method``: E_KS + c_os E_OS + c_ss E_SS + E_disp, SCF converged to 1e-10) in a uniform electric
field F added to the KS-SCF's core Hamiltonian (so that its Fock matrix and orbital energies, and
so our PT2 stage on its orbitals, carry the field: μ = nuclear - dE/dF, origin 0), and PySCF's
``dip_moment`` of a DF-RKS of the functional's hybrid part that PySCF converges itself (the KS
dipole). Water distorted so that no component vanishes."""

import dataclasses

import numpy as np
import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from gradient_fd import INPUTS, NH2, distorted
from gradient_fd import options as _options

from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.functionals import FUNCTIONALS
from dfmp2.interfaces import api
from dfmp2.io import molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.scf import pyscf_scf

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = distorted(read_xyz(INPUTS / "water.xyz"))
FD_TOL_AU = 1e-5  # e*bohr: the acceptance, relaxed dipole against -dE/dF (measured: below 1e-9)
STEP = 5e-4  # a.u. of field; fourth-order central differences over STEP and 2 STEP
CASES = {  # (functional, frozen core): a GGA double hybrid, one with D3(BJ), one with P86, the meta-GGA one
    "b2plyp": ("b2plyp", False),
    "dsd-blyp-fc": ("dsd-blyp", True),
    "dsd-pbep86-fc": ("dsd-pbep86", True),
    "pwpb95-d3bj-fc": ("pwpb95-d3bj", True),
}


def _field(monkeypatch, F):
    """Every PySCF SCF made from here on has F·r (origin 0, a.u.) added to its core Hamiltonian
    (``pyscf_scf._prepared``, where ``run_ks`` sets its SCF up): its Fock matrix, orbitals and
    energies are those in the field."""
    prepared = pyscf_scf._prepared

    def in_field(mf, *args, **kw):
        mf, *rest = prepared(mf, *args, **kw)
        mol = mf.mol
        with mol.with_common_orig((0, 0, 0)):
            r = mol.intor_symmetric("int1e_r", comp=3)
        h = type(mf).get_hcore(mf, mol) + np.einsum("x,xij->ij", F, r)
        mf.get_hcore = lambda *a, **k: h
        return (mf, *rest)

    monkeypatch.setattr(pyscf_scf, "_prepared", in_field)


def _nuclear(opts, geom=WATER) -> np.ndarray:
    mol = molecule.build_molecule(geom, opts.basis, None, None)
    return np.einsum("a,ax->x", mol.atom_charges(), mol.atom_coords())


def field_dipole(opts, step: float = STEP, geom=WATER):
    """(fourth-order, second-order) central differences of -dE/dF plus the nuclear dipole, (3,)
    e·bohr each: E the printed double-hybrid energy at fields ±step, ±2 step along each axis."""
    be = energy_driver.make_backend(opts)
    out4, out2 = [], []
    for k in range(3):
        e = {}
        for s in (1, -1, 2, -2):
            F = np.zeros(3)
            F[k] = s * step
            with pytest.MonkeyPatch.context() as mp:
                _field(mp, F)
                e[s] = api.run(geom, opts, backend=be).double_hybrid["e_total"]
        out4.append((8 * (e[1] - e[-1]) - (e[2] - e[-2])) / (12 * step))
        out2.append((e[1] - e[-1]) / (2 * step))
    nuc = _nuclear(opts, geom)
    return nuc - np.array(out4), nuc - np.array(out2)


@pytest.mark.heavy
@pytest.mark.parametrize("case", sorted(CASES))
def test_relaxed_dipole_is_the_field_derivative_of_the_double_hybrid_energy(case):
    """Water/cc-pVDZ, grid level 3: every component of the relaxed dipole against -dE/dF of our
    energy to FD_TOL_AU (fourth order, step 5e-4; the second-order difference of the same step
    agrees to 1e-6: the step's error is small); the KS dipole is not it (the PT2 part matters)."""
    functional, fc = CASES[case]
    opts = _options(basis="cc-pvdz", frozen_core=fc, method=functional)
    r = api.run(WATER, dataclasses.replace(opts, properties=("dipole",)))
    dip = r.properties["dipole"]
    mu, ks = np.array(dip["relaxed"]["au"]), np.array(dip["ks"]["au"])
    fd4, fd2 = field_dipole(opts)
    assert np.abs(mu - fd4).max() <= FD_TOL_AU, (mu, fd4)
    assert np.abs(fd4 - fd2).max() <= 1e-6
    assert np.abs(mu - ks).max() > 1e-3 and np.abs(mu).min() > 1e-2


@pytest.mark.heavy
def test_open_shell_relaxed_dipole_is_the_field_derivative_of_the_energy():
    """NH2 (UKS doublet, no degenerate shell), B2PLYP with frozen core, cc-pVDZ, grid level 3:
    the relaxed dipole (the UKS Z-vector with PySCF's UKS response) against -dE/dF of our
    energy to FD_TOL_AU, as for water."""
    opts = _options(basis="cc-pvdz", frozen_core=True, method="b2plyp")
    r = api.run(NH2, dataclasses.replace(opts, properties=("dipole",)))
    dip = r.properties["dipole"]
    assert r.properties["densities"]["ran"]["reference"] == "uks"
    mu, ks = np.array(dip["relaxed"]["au"]), np.array(dip["ks"]["au"])
    fd4, fd2 = field_dipole(opts, geom=NH2)
    assert np.abs(mu - fd4).max() <= FD_TOL_AU, (mu, fd4)
    assert np.abs(fd4 - fd2).max() <= 3e-6  # the second-order difference's step error (1.0e-6 along z)
    assert np.abs(mu - ks).max() > 1e-3


def test_open_shell_dipole_of_a_closed_shell_is_the_closed_shell_s():
    """Water run as UKS (--reference uhf) and as RKS, B2PLYP/STO-3G at grid level 1: the KS and
    relaxed dipoles agree to 1e-7 e·bohr (the UKS densities' spin sums are the RKS ones)."""
    opts = _options(basis="sto-3g", method="b2plyp", dft_grid=1, properties=("dipole",))
    rks = api.run(WATER, opts).properties
    uks = api.run(WATER, dataclasses.replace(opts, reference="uhf")).properties
    assert uks["densities"]["ran"]["reference"] == "uks" and rks["densities"]["ran"]["reference"] == "rks"
    for kind in ("ks", "relaxed"):
        assert np.abs(np.array(uks["dipole"][kind]["au"]) - rks["dipole"][kind]["au"]).max() < 1e-7, kind


@pytest.mark.heavy
def test_gradient_and_qcschema_give_the_run_s_dipole():
    """B2PLYP water/STO-3G (grid 1): ``dfmp2 gradient --properties dipole``'s dipole (from the
    gradient's own densities, what frequencies' IR intensities read) and the QCSchema driver
    'properties' equal ``dfmp2 run``'s (the density stage) to 1e-8 e·bohr."""
    pytest.importorskip("qcelemental", reason="QCSchema path: qcelemental is not installed")
    from pyscf.lib.parameters import BOHR

    from dfmp2.interfaces.qcschema import run_atomic_input

    opts = _options(basis="sto-3g", method="b2plyp", dft_grid=1, properties=("dipole",))
    run = api.run(WATER, opts).properties
    gr = gradient_driver.run_gradient(WATER, opts, method="b2plyp")
    g = gr.result.properties
    assert (
        g["densities"]["made_by"] == "the gradient stage" and g["densities"]["double_hybrid"]["functional"] == "B2PLYP"
    )
    for kind in ("ks", "relaxed"):
        assert np.allclose(g["dipole"][kind]["au"], run["dipole"][kind]["au"], atol=1e-8, rtol=0), kind
    doc = {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "properties",
        "model": {"method": "b2plyp", "basis": "sto-3g"},
        "keywords": {},
        "molecule": {
            "symbols": list(WATER.symbols),
            "geometry": (np.asarray(WATER.coords_angstrom) / BOHR).ravel().tolist(),
        },
    }
    atomic, result = run_atomic_input(doc, dataclasses.replace(opts, properties=(), dft_grid=1))
    dip = result.properties["dipole"]
    assert np.allclose(atomic.return_result["dipole"], run["dipole"]["relaxed"]["au"], atol=1e-8, rtol=0)
    assert np.allclose(atomic.properties.scf_dipole_moment, dip["ks"]["au"], atol=1e-14, rtol=0)
    assert atomic.properties.mp2_dipole_moment is None
    assert atomic.extras["qcvars"]["B2PLYP DIPOLE"] == atomic.extras["qcvars"]["CURRENT DIPOLE"]


def test_ks_dipole_is_pyscfs_and_the_record_names_the_functional():
    """B2PLYP water/STO-3G at grid level 1: the 'ks' dipole equals PySCF's ``dip_moment`` of a
    DF-RKS of B2PLYP's hybrid part on the same JK-fit set and grid that PySCF converges itself
    (1e-6 D); the relaxed one differs from it (the PT2 part); no HF or MP2 dipole is written; the
    densities' record says what they differentiate and what ran."""
    from pyscf import dft

    opts = _options(basis="sto-3g", method="b2plyp", dft_grid=1, properties=("dipole",))
    r = api.run(WATER, opts)
    dip, dens = r.properties["dipole"], r.properties["densities"]
    assert set(dip) >= {"ks", "relaxed"} and not {"hf", "unrelaxed"} & set(dip) and dip["method"] == "b2plyp"
    mol = molecule.build_molecule(WATER, "sto-3g", None, None)
    mf = dft.RKS(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.xc, mf.grids.level, mf.conv_tol, mf.conv_tol_grad, mf.verbose = FUNCTIONALS["b2plyp"].xc, 1, 1e-12, 1e-9, 0
    mf.kernel()
    theirs = mf.dip_moment(unit="Debye", verbose=0)
    assert np.abs(np.array(dip["ks"]["debye"]) - theirs).max() < 1e-6
    assert np.abs(np.array(dip["relaxed"]["au"]) - np.array(dip["ks"]["au"])).max() > 1e-3
    assert dens["method"] == "b2plyp" and dens["zvector"]["form"] == "ks-response"
    assert dens["double_hybrid"]["functional"] == "B2PLYP" and dens["ran"]["reference"] == "rks"
    assert set(dens["timings"]) == {"props_mp2_densities", "props_zvector"}


@pytest.mark.parametrize(
    ("extra", "fragments"),
    [
        (["--scf", "exact"], ["relaxed B2PLYP density", "density-fitted SCF", "(--properties, --scf)"]),
        (["--device", "trn1", "--simulate"], ["of a double hybrid (B2PLYP) need fp64", "(--properties, --device)"]),
    ],
)
def test_what_a_double_hybrid_s_properties_refuse(extra, fragments):
    """One error line before any SCF: exact J/K, no fp64."""
    r = CliRunner().invoke(
        main, ["run", str(INPUTS / "water.xyz"), "--method", "b2plyp", "--properties", "dipole", *extra]
    )
    assert_one_line_error(r, *fragments)
    assert r.exit_code == 2 and "cycle" not in r.output
