"""The closed-shell (RKS) double-hybrid gradient (dfmp2.grad.dh) against references that do not come
from it: central finite differences of our own double-hybrid energies (``dfmp2 run --method``: E_KS
+ c_os E_OS + c_ss E_SS + E_disp, SCF converged to 1e-10, the default grid level 3), and PySCF's
DF-RKS gradient (pyscf.df.grad.rks, with its grid response) of a KS-SCF of the same hybrid part,
converged by PySCF itself, for the KS part. Geometries distorted so that no component vanishes."""

import json

import numpy as np
import pytest
from channels import heavy_cases
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from gradient_fd import INPUTS, NH2, STEP, assert_matches_fd, assert_matches_fd_along, distorted
from gradient_fd import options as _options

from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.errors import InputError
from dfmp2.functionals import FUNCTIONALS
from dfmp2.io import molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = distorted(read_xyz(INPUTS / "water.xyz"))
# (functional, frozen core): each functional of the table, B2PLYP both ways (cc-pVDZ, grid 3)
CASES = {
    "b2plyp": ("b2plyp", False),
    "b2plyp-fc": ("b2plyp", True),
    "b2gp-plyp-fc": ("b2gp-plyp", True),
    "mpw2plyp": ("mpw2plyp", False),
    "dsd-blyp-fc": ("dsd-blyp", True),
    "dsd-pbep86-fc": ("dsd-pbep86", True),
    "revdsd-pbep86-d4-fc": ("revdsd-pbep86-d4", True),
    "pwpb95-d3bj-fc": ("pwpb95-d3bj", True),
}


# open shells through UKS (frozen core, cc-pVDZ, grid 3): OH (distorted; its pi doublet's stall, see
# test_uks_double_hybrid_gradient_matches_finite_differences) with B2PLYP and the meta-GGA PWPB95,
# NH2 (no degenerate shell) with B2PLYP; the rest measured once (docs/double_hybrids.md)
OH = distorted(read_xyz(INPUTS / "open_shell" / "hydroxyl.xyz"))
UKS_CASES = {"oh-b2plyp": (OH, "b2plyp"), "oh-pwpb95-d3bj": (OH, "pwpb95-d3bj"), "nh2-b2plyp": (NH2, "b2plyp")}


_cache = {}


def _run(functional, frozen_core, geom=WATER, **kw):
    opts = _options(basis=kw.pop("basis", "cc-pvdz"), frozen_core=frozen_core, method=functional, **kw)
    key = repr((opts, geom.symbols, geom.coords_angstrom.tolist()))
    if key not in _cache:
        _cache[key] = gradient_driver.run_gradient(geom, opts, method=functional)
    return opts, _cache[key]


@pytest.mark.heavy
@pytest.mark.parametrize("case", sorted(CASES))
def test_double_hybrid_gradient_matches_finite_differences(case):
    """Every component against central differences (step 1e-3 bohr, converged by halving) of
    the printed energy, to 1e-6 Eh/bohr (the acceptance: 2e-6) at the default grid (level 3)."""
    functional, fc = CASES[case]
    opts, gr = _run(functional, fc)
    assert gr.result.double_hybrid["ks_scf"]["grid"]["level"] == 3
    assert_matches_fd(gr.gradient, WATER, opts, functional)


@pytest.mark.heavy
@pytest.mark.parametrize("case", sorted(UKS_CASES))
def test_uks_double_hybrid_gradient_matches_finite_differences(case):
    """Open shells (UKS, frozen core, cc-pVDZ, grid level 3): every component against central
    differences (converged by halving) of the printed energy, to 1e-6 Eh/bohr. OH's DIIS stalls on
    its pi doublet's flat rotation, near a maximum there; the soft-mode finish
    (dfmp2.scf.pyscf_scf.soft_mode_finish) converges it, in the gradient run and in every energy of
    the differences alike (without it: 4e-5 Eh/bohr). Along that soft rotation the energy's minimum
    moves fast with the geometry: OH's differences at 1e-3 bohr are 6e-6 from those at 5e-4 (which
    are within 1e-8 of the analytic gradient), so its step is 5e-4 (docs/double_hybrids.md).
    PWPB95 on OH (meta-GGA: its SCF's finish is the slowest) along one random direction."""
    geom, functional = UKS_CASES[case]
    opts, gr = _run(functional, True, geom)
    assert gr.parts.ran["reference"] == "uks"
    step = 5e-4 if case.startswith("oh") else STEP
    if case.startswith("oh"):
        assert gr.result.to_dict()["ran"]["scf"]["stalled"]["second_order"]["gradient"] < 1e-10
    if case == "oh-pwpb95-d3bj":  # every component: 8.9e-7 (docs/double_hybrids.md), 10 min here; one direction
        d = np.random.default_rng(60).normal(size=gr.gradient.shape)
        assert_matches_fd_along(gr.gradient, geom, opts, functional, d / np.linalg.norm(d), step=step)
    else:
        assert_matches_fd(gr.gradient, geom, opts, functional, step=step)


@pytest.mark.heavy
def test_double_hybrid_gradient_along_a_direction_sto3g():
    """The default channel's check: B2PLYP with frozen core on water/STO-3G (grid level 3), the
    gradient along one random direction of all atoms against the energies' central difference."""
    opts, gr = _run("b2plyp", True, basis="sto-3g")
    d = np.random.default_rng(60).normal(size=gr.gradient.shape)
    assert_matches_fd_along(gr.gradient, WATER, opts, "b2plyp", d / np.linalg.norm(d))


def test_ks_part_is_pyscfs_rks_gradient():
    """The KS part is PySCF's DF-RKS gradient (with grid response) of a KS-SCF of B2PLYP's hybrid
    part on the same JK-fit set and grid, converged by PySCF here, to 1e-8 Eh/bohr; the parts add
    up to the gradient; translational invariance holds to the PT2 part's grid response (1e-6)."""
    from pyscf import dft

    _, gr = _run("b2plyp", False, basis="sto-3g", dft_grid=1)
    mol = molecule.build_molecule(WATER, "sto-3g", None, None)
    mf = dft.RKS(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.xc, mf.grids.level, mf.conv_tol, mf.conv_tol_grad, mf.verbose = FUNCTIONALS["b2plyp"].xc, 1, 1e-13, 1e-10, 0
    mf.kernel()
    g = mf.nuc_grad_method()
    g.grid_response = True
    ks = g.kernel()
    dh = gr.parts.double_hybrid
    assert np.abs(np.asarray(dh["ks"]) - ks).max() < 1e-8
    assert np.allclose(gr.parts.hf, ks, atol=1e-8) and dh["dispersion"] is None
    assert np.allclose(np.asarray(dh["ks"]) + np.asarray(dh["pt2"]), gr.gradient, atol=1e-14)
    assert np.abs(gr.gradient.sum(axis=0)).max() < 1e-5  # the PT2 part's grid response, at grid level 1
    assert gr.energy == gr.result.double_hybrid["e_total"] and gr.method == "b2plyp"
    assert abs(gr.parts.e_corr - 0.27 * (gr.result.e_os + gr.result.e_ss)) < 1e-10  # c_os E_OS + c_ss E_SS
    assert gr.parts.ran["reference"] == "rks" and gr.parts.zvector["form"] == "ks-response"


def test_cli_gradient_of_a_double_hybrid(tmp_path):
    """dfmp2 gradient --method dsd-blyp (any of its names, any case) on water/STO-3G: the table
    titled by the functional, the JSON (validated against the schema by the test's fixture)
    saying which double hybrid ran, with its parts: KS, PT2 and the D3(BJ) dispersion."""
    xyz, out = tmp_path / "w.xyz", tmp_path / "g.json"
    geom = WATER
    xyz.write_text(
        "3\n\n" + "".join(f"{s} {x:.8f} {y:.8f} {z:.8f}\n" for s, (x, y, z) in zip(geom.symbols, geom.coords_angstrom))
    )
    r = CliRunner().invoke(
        main, ["gradient", str(xyz), "--basis", "sto-3g", "--method", "DSD-BLYP", "--dft-grid", "1", "--json", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "E(DSD-BLYP)" in r.output
    d = json.loads(out.read_text())
    g = d["gradient"]
    assert g["method"] == "dsd-blyp" and d["double_hybrid"]["functional"]["name"] == "DSD-BLYP-D3(BJ)"
    assert g["energy"] == d["double_hybrid"]["e_total"] and g["double_hybrid"]["functional"] == "DSD-BLYP-D3(BJ)"
    parts = [np.asarray(g["double_hybrid"][k]) for k in ("ks", "pt2", "dispersion")]
    assert np.allclose(sum(parts), g["gradient"], atol=1e-14) and np.abs(parts[2]).max() > 1e-7
    assert g["double_hybrid"]["grid_level"] == 1 and d["double_hybrid"]["ks_scf"]["grid"]["level"] == 1


def test_a_closed_shell_through_uks_is_the_rks_gradient():
    """Water (α = β) run as UKS (--reference uhf), B2PLYP on STO-3G at grid level 1: the UKS
    double-hybrid gradient (its per-spin Z-vector, Fock and XC derivatives) equals the RKS one
    to 1e-8 Eh/bohr, and says it ran on a UKS reference (refused before: closed shells only)."""
    _, rks = _run("b2plyp", False, basis="sto-3g", dft_grid=1)  # test_ks_part_is_pyscfs_rks_gradient's
    _, uks = _run("b2plyp", False, basis="sto-3g", dft_grid=1, reference="uhf")
    assert uks.parts.ran["reference"] == "uks" and rks.parts.ran["reference"] == "rks"
    assert uks.energy_run.ref.mf.istype("UKS") and uks.parts.zvector["form"] == "ks-response"
    assert np.abs(uks.gradient - rks.gradient).max() < 1e-8
    assert np.abs(uks.gradient).min() > 1e-4  # no component vanishes by symmetry


def test_uks_ks_part_is_pyscfs_uks_gradient():
    """NH2 (doublet) through UKS, B2PLYP with frozen core on STO-3G at grid level 0: the KS part is
    PySCF's DF-UKS gradient (with grid response) of a KS-SCF of the same hybrid part, converged by
    PySCF here (from our density: a few cycles), to 1e-8 Eh/bohr; the parts add up; the JSON's
    parts name PySCF's UKS gradient."""
    from pyscf import dft

    opts = _options(basis="sto-3g", frozen_core=True, method="b2plyp", dft_grid=0)
    gr = gradient_driver.run_gradient(NH2, opts, method="b2plyp")
    mol = molecule.build_molecule(NH2, "sto-3g", None, None)
    mf = dft.UKS(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.xc, mf.grids.level, mf.conv_tol, mf.conv_tol_grad, mf.verbose = FUNCTIONALS["b2plyp"].xc, 0, 1e-13, 1e-10, 0
    mf.kernel(dm0=gr.energy_run.ref.mf.make_rdm1())
    assert mf.converged
    g = mf.nuc_grad_method()
    g.grid_response = True
    ks = g.kernel()
    dh = gr.parts.double_hybrid
    assert np.abs(np.asarray(dh["ks"]) - ks).max() < 1e-8 and np.allclose(gr.parts.hf, ks, atol=1e-8)
    assert np.allclose(np.asarray(dh["ks"]) + np.asarray(dh["pt2"]), gr.gradient, atol=1e-14)
    assert dh["ks_gradient"].startswith("pyscf.df.grad.uks") and gr.parts.ran["reference"] == "uks"
    assert abs(gr.parts.e_corr - 0.27 * (gr.result.e_os + gr.result.e_ss)) < 1e-10


def test_a_double_hybrid_gradient_without_fp64_is_refused():
    r = CliRunner().invoke(
        main, ["gradient", str(INPUTS / "water.xyz"), "--basis", "sto-3g", "--method", "b2plyp", "--device", "trn1"]
    )
    assert_one_line_error(r, "needs fp64", "trn1")


@pytest.mark.parametrize("functional", ["dsd-pbep86", "revdsd-pbep86-d4"])
def test_the_p86_functionals_gradient_is_offered(functional):
    """The P86 functionals were refused while libxc's P86 jumped at r_s = 1 (functionals._p86): now
    ``dfmp2 gradient --method`` offers them (their finite-difference checks: the heavy CASES)."""
    text = CliRunner().invoke(main, ["gradient", "--help"], terminal_width=400).output
    assert functional in text


def test_two_methods_named_are_refused():
    """A gradient of SCS-MP2 asked of a double hybrid's run: one InputError, before any work."""
    with pytest.raises(InputError, match="differ"):
        gradient_driver.run_gradient(WATER, RunOptions(basis="sto-3g", method="b2plyp"), method="scs-mp2")
    assert gradient_driver.gradient_options(RunOptions(method="b2plyp"), "mp2")[1] == "b2plyp"
    assert gradient_driver.gradient_options(RunOptions(), "B2GPPLYP") == (RunOptions(method="b2gp-plyp"), "b2gp-plyp")
    assert gradient_driver.gradient_options(RunOptions(), "scs-mp2") == (RunOptions(), "scs-mp2")


@pytest.mark.parametrize("case", heavy_cases(["api"], {"api"}))
def test_api_gradient_of_a_double_hybrid(case):
    import dfmp2

    gr = dfmp2.gradient(str(INPUTS / "water.xyz"), method="mpw2plyp", basis="sto-3g", frozen_core=True)
    assert gr.method == "mpw2plyp" and gr.to_dict()["gradient"]["double_hybrid"]["functional"] == "mPW2PLYP"


def test_a_ks_scf_whose_df_tensor_was_on_disk(monkeypatch):
    """The KS-SCF's DF tensor in a file of its scratch directory (as for a large molecule: every
    tensor forced there), removed when the SCF returns: the gradient rebuilds it for the Z-vector
    and equals the in-memory run's."""
    from dfmp2.scf import pyscf_scf

    _, ref = _run("b2plyp", False, basis="sto-3g", dft_grid=1)
    monkeypatch.setattr(pyscf_scf, "PYSCF_DF_INCORE_SHARE", 0.0)
    opts = _options(basis="sto-3g", method="b2plyp", dft_grid=1)
    gr = gradient_driver.run_gradient(WATER, opts, method="b2plyp")
    assert gr.energy_run.ref.scf.df_tensor == "disk" and gr.energy_run.ref.mf is not ref.energy_run.ref.mf
    assert np.abs(gr.gradient - ref.gradient).max() < 1e-9
