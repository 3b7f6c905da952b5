"""The UHF DF-MP2 nuclear gradient (dfmp2.grad.ump2) against references that do not come from
it: central finite differences of our own printed UHF energies (``dfmp2.interfaces.api.run``, both
fitting sets, SCF converged to 1e-10), the step shown converged (the halved step agrees), PySCF's
DF-UHF gradient (``pyscf.df.grad.uhf``) for the HF part, and the RHF gradient (dfmp2.grad.mp2,
itself tested against finite differences) for a closed shell run with a UHF reference.
Geometries are distorted so that no component vanishes by symmetry (OH: two atoms, every
component still nonzero)."""

import dataclasses
import json

import numpy as np
import pytest
from channels import heavy_cases
from click.testing import CliRunner
from gradient_fd import INPUTS, assert_dropin_matches_fd_along, assert_matches_fd, assert_matches_fd_along, distorted
from gradient_fd import options as _options
from pyscf.data.nist import BOHR

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.errors import EXIT_USER_ERROR
from dfmp2.grad import common as grad_common
from dfmp2.grad import mp2 as grad_mp2
from dfmp2.grad import plan as grad_plan
from dfmp2.grad import ump2 as grad_ump2
from dfmp2.interfaces import api
from dfmp2.io.xyz import Geometry, read_xyz
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small problems: one thread is faster


def _radical(name: str):
    """OH (the G2 input) or NH2 (water's distorted frame with N: a doublet), distorted (Å)."""
    if name == "nh2":
        g = dataclasses.replace(read_xyz(INPUTS / "water.xyz"), symbols=("N", "H", "H"), charge=0, multiplicity=2)
    else:
        g = read_xyz(INPUTS / "open_shell" / "hydroxyl.xyz")
    return distorted(g)


CASES = {  # name: (molecule, options, method): one all-electron MP2, one frozen-core SCS-MP2
    "oh-mp2": ("oh", dict(basis="6-31g"), "mp2"),
    "nh2-fc-scs": ("nh2", dict(basis="6-31g", frozen_core=True), "scs-mp2"),
}
_cache = {}


def _analytic(case):
    if case not in _cache:
        mol, kw, method = CASES[case]
        geom = _radical(mol)
        _cache[case] = (geom, _options(**kw), method, gradient_driver.run_gradient(geom, _options(**kw), method=method))
    return _cache[case]


@pytest.mark.parametrize("case", heavy_cases(sorted(CASES), {"nh2-fc-scs", "oh-mp2"}))
def test_uhf_gradient_matches_finite_differences_per_component(case):
    geom, options, method, gr = _analytic(case)
    assert gr.result.spin["reference"] == "UHF" and gr.parts.ran["reference"] == "uhf"
    g = gr.gradient
    # the step is converged: halving it agrees at the worst component and at the largest (stiffest)
    assert_matches_fd(g, geom, options, method, also=[np.unravel_index(np.abs(g).argmax(), g.shape)])
    assert np.abs(g).min() > 1e-5  # no component is zero by symmetry: each is a test


@pytest.mark.parametrize("case", sorted(CASES))
def test_uhf_gradient_differentiates_the_printed_energy_and_has_no_net_force(case):
    geom, _, method, gr = _analytic(case)
    c_os, c_ss = grad_mp2.SCALES[method]
    assert gr.parts.e_corr == pytest.approx(c_os * gr.result.e_os + c_ss * gr.result.e_ss, abs=1e-10)
    assert gr.energy == pytest.approx(gr.result.e_hf + c_os * gr.result.e_os + c_ss * gr.result.e_ss, abs=1e-12)
    g, r = gr.gradient, geom.coords_angstrom / BOHR
    assert np.abs(g.sum(axis=0)).max() < 1e-9
    assert np.abs(np.cross(r, g).sum(axis=0)).max() < 1e-8
    z = gr.parts.zvector
    assert z["iterations"] > 0 and z["residual"] < 1e-9


EDGE = {  # no beta electron at all (E_corr 0: the DF-UHF gradient); a triplet with frozen core
    "h2+": (
        Geometry(("H", "H"), np.array([[0.0, 0.01, 0.0], [0.02, 0.0, 1.0]]), charge=1, multiplicity=2),
        dict(basis="6-31g"),
    ),
    "ch2-triplet-fc": (
        Geometry(
            ("C", "H", "H"),
            np.array([[0.0, 0.01, 0.0], [0.02, 0.9, 0.6], [0.0, -0.92, 0.63]]),
            charge=0,
            multiplicity=3,
        ),
        dict(basis="6-31g", frozen_core=True),
    ),
}


@pytest.mark.parametrize("case", heavy_cases(sorted(EDGE), {"ch2-triplet-fc"}))
def test_uhf_gradient_edge_cases_match_finite_differences(case):
    geom, kw = EDGE[case]
    options = _options(**kw)
    g = gradient_driver.run_gradient(geom, options, method="mp2").gradient
    assert_matches_fd(g, geom, options, "mp2", halve=False)
    assert np.abs(g.sum(axis=0)).max() < 1e-9


def test_uhf_hf_part_matches_pyscf_df_uhf_gradient():
    """The DF-UHF part (one-electron, overlap, J of the total density, K per spin on the JK-fit
    set) against PySCF's DF-UHF gradient on the same fitting set and orbitals."""
    from pyscf import scf as pyscf_scf
    from pyscf.df.grad import uhf as df_uhf_grad

    geom, options, _, _ = _analytic("nh2-fc-scs")
    seen = {}
    api.run(geom, options, on_reference=lambda mol, ref: seen.update(mol=mol, ref=ref))
    mol, ref = seen["mol"], seen["ref"]
    parts = grad_ump2.uhf_mp2_gradient(
        mol,
        ref,
        basis.make_auxmol(mol, basis.mp2_auxbasis(mol)),
        basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk")),
        linalg.get_backend("cpu"),
    )
    mf = pyscf_scf.UHF(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.mo_coeff = np.stack([c.mo_coeff for c in ref.channels])
    mf.mo_energy = np.stack([c.mo_energy for c in ref.channels])
    mf.mo_occ = np.stack([np.where(np.arange(c.nmo) < c.nocc, 1.0, 0.0) for c in ref.channels])
    mf.e_tot, mf.converged = ref.e_hf, True
    g_pyscf = df_uhf_grad.Gradients(mf).kernel()
    assert np.abs(parts.hf - g_pyscf).max() <= 1e-8


@pytest.mark.parametrize("frozen_core, method", [(False, "mp2"), (True, "scs-mp2")])
def test_closed_shell_with_a_uhf_reference_gives_the_rhf_gradient(frozen_core, method):
    """Water run with reference uhf: α = β, every UHF term half the RHF's spin-summed one."""
    geom = distorted(read_xyz(INPUTS / "water.xyz"))
    rhf = gradient_driver.run_gradient(geom, _options(basis="6-31g", frozen_core=frozen_core), method=method)
    uhf = gradient_driver.run_gradient(
        geom, _options(basis="6-31g", frozen_core=frozen_core, reference="uhf"), method=method
    )
    assert uhf.result.spin["reference"] == "UHF" and uhf.parts.ran["reference"] == "uhf"
    assert np.abs(uhf.gradient - rhf.gradient).max() <= 1e-8
    assert np.abs(uhf.parts.hf - rhf.parts.hf).max() <= 1e-8


def test_sos_mp2_on_pyscf_uhf_along_a_direction():
    """SOS-MP2 (no same-spin pairs) on PySCF's DF-UHF (the same JK-fit set), along one
    displacement of both atoms at once."""
    geom = _radical("oh")
    options = _options(basis="6-31g", scf_mode="pyscf-df")
    gr = gradient_driver.run_gradient(geom, options, method="sos-mp2")
    assert gr.result.ran["scf"]["engine"] == "pyscf"
    d = np.random.default_rng(11).normal(size=gr.gradient.shape)
    d /= np.linalg.norm(d)
    assert_matches_fd_along(gr.gradient, geom, options, "sos-mp2", d)


def test_cli_gradient_on_a_doublet_writes_json(tmp_path):
    out = tmp_path / "g.json"
    r = CliRunner().invoke(
        main, ["gradient", str(INPUTS / "open_shell" / "hydroxyl.xyz"), "--basis", "sto-3g", "-q", "--json", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "nuclear gradient of E(MP2)" in r.output
    d = json.loads(out.read_text())
    g = np.array(d["gradient"]["gradient"])
    assert g.shape == (2, 3) and np.abs(g).max() > 1e-3 and d["units"]["gradient"] == "hartree/bohr"
    assert d["gradient"]["ran"]["reference"] == "uhf" and d["gradient"]["zvector"]["iterations"] > 0


@pytest.mark.parametrize(
    "args, words",
    [
        (["--reference", "rohf"], "ROHF references are not supported"),
        (["--reference", "rhf"], "open-shell"),
        (["--scf", "exact"], "density-fitted SCF"),
        (["--precision", "fp32"], "use precision fp64"),
    ],
)
def test_cli_gradient_on_a_doublet_refuses_in_one_line_before_the_scf(args, words, no_scf):
    r = CliRunner().invoke(main, ["gradient", str(INPUTS / "open_shell" / "hydroxyl.xyz"), "--basis", "sto-3g", *args])
    assert r.exit_code == EXIT_USER_ERROR, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.output


def test_uhf_gradient_memory_is_the_uhf_plan_and_refused_before_the_scf(no_scf):
    geom = read_xyz(INPUTS / "open_shell" / "hydroxyl.xyz")
    need = gradient_driver.check_gradient_memory(
        geom, RunOptions(basis="cc-pvdz", memory_mb=1e5), energy_driver.make_backend(RunOptions())
    )
    # OH/cc-pVDZ: 19 functions, 5 alpha and 4 beta electrons; cc-pVDZ-RI 70 and cc-pVDZ-JKFIT 93 auxiliary functions
    shapes = dict(nao=19, nocc=(5, 4), nact=(5, 4), nvir=(14, 15), naux_mp2=70, naux_jk=93)
    phases = grad_plan.uhf_phase_mb(**shapes)
    assert need >= max(phases.values()) and need == pytest.approx(grad_plan.choose_plan(shapes, 1e5).peak_mb)
    small = grad_plan.make_plan(shapes, *grad_plan.DISK_PLAN, factor="disk", fit_mb=1e-9).peak_mb
    assert small <= need
    r = CliRunner().invoke(
        main,
        [
            "gradient",
            str(INPUTS / "open_shell" / "hydroxyl.xyz"),
            "--basis",
            "cc-pvdz",
            "--memory",
            f"{small / 2:.4f}MB",
        ],
    )
    assert r.exit_code == EXIT_USER_ERROR and "the gradient stage needs about" in r.output, r.output
    assert "smallest plan" in r.output and "Traceback" not in r.output, r.output


def test_the_rhf_stage_refuses_a_uhf_reference_and_the_uhf_stage_an_rhf_one():
    geom = _radical("oh")
    seen = {}
    api.run(geom, _options(basis="sto-3g"), on_reference=lambda mol, ref: seen.update(mol=mol, ref=ref))
    mol, ref = seen["mol"], seen["ref"]
    aux, jk = basis.make_auxmol(mol, basis.mp2_auxbasis(mol)), basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    with pytest.raises(grad_common.GradientError, match="uhf_mp2_gradient"):
        grad_mp2.mp2_gradient(mol, ref, aux, jk, linalg.get_backend("cpu"))
    rhf = dataclasses.replace(ref, channels=ref.channels[:1], s2=None, s2_exact=None)
    with pytest.raises(grad_common.GradientError, match="needs a UHF reference"):
        grad_ump2.uhf_mp2_gradient(mol, rhf, aux, jk, linalg.get_backend("cpu"))


SLOW_CASES = {  # per component: OH all-electron, the methyl radical frozen core (cc-pVDZ), HI+ with its ECP
    "oh-cc-pvdz": ("open_shell/hydroxyl.xyz", dict(basis="cc-pvdz"), "mp2"),
    "methyl-fc": ("open_shell/methyl.xyz", dict(basis="cc-pvdz", frozen_core=True), "mp2"),
    "hi-cation-ecp": ("ecp/hydrogen_iodide.xyz", dict(basis="def2-svp", charge=1, multiplicity=2), "mp2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SLOW_CASES))
def test_uhf_gradient_matches_finite_differences_slow(case):
    xyz, kw, method = SLOW_CASES[case]
    geom = distorted(read_xyz(INPUTS / xyz))
    options = _options(**kw)
    g = gradient_driver.run_gradient(geom, options, method=method).gradient
    assert_matches_fd(g, geom, options, method)


def test_dropin_nuc_grad_method_on_a_pyscf_df_uhf_matches_its_finite_differences():
    """dfmp2.DFMP2(mf).nuc_grad_method().kernel() on PySCF's DF-UHF of NH2 with frozen core: the
    derivative of PySCF's DF-UHF energy plus our DF-MP2, along one displacement of all atoms."""
    from pyscf import gto
    from pyscf import scf as pyscf_scf

    def mf_at(coords):
        mol = gto.M(atom=[("N", coords[0]), ("H", coords[1]), ("H", coords[2])], unit="Bohr", basis="6-31g", spin=1)
        mf = pyscf_scf.UHF(mol).density_fit()
        mf.conv_tol, mf.conv_tol_grad, mf.max_cycle, mf.verbose = 1e-12, 1e-9, 200, 0
        mf.run()
        assert mf.converged
        return mf

    assert_dropin_matches_fd_along(mf_at, _radical("nh2").coords_angstrom / BOHR, seed=5)


def test_api_gradient_of_a_doublet():
    import dfmp2

    gr = dfmp2.gradient(str(INPUTS / "open_shell" / "hydroxyl.xyz"), basis="sto-3g")
    assert gr.gradient.shape == (2, 3) and gr.parts.ran["reference"] == "uhf"
    assert gr.to_dict()["energies"]["e_mp2"] == pytest.approx(gr.energy, abs=1e-12)


def test_qcschema_driver_gradient_on_a_doublet():
    """A v1 AtomicInput of OH (multiplicity 2) with driver 'gradient': return_result is the
    gradient ``dfmp2 gradient`` computes for the same molecule."""
    pytest.importorskip("qcelemental", reason="QCSchema needs qcelemental (the qcschema extra)")
    from dfmp2.interfaces import qcschema

    geom = _radical("oh")
    doc = {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "gradient",
        "model": {"method": "mp2", "basis": "sto-3g"},
        "molecule": {
            "symbols": list(geom.symbols),
            "geometry": (geom.coords_angstrom / BOHR).ravel().tolist(),
            "molecular_charge": 0,
            "molecular_multiplicity": 2,
            "fix_com": True,
            "fix_orientation": True,
        },
    }
    r = qcschema.run_qcschema(doc)
    g = np.asarray(r.return_result).reshape(-1, 3)
    ours = gradient_driver.run_gradient(geom, RunOptions(basis="sto-3g")).gradient
    assert g.shape == (2, 3) and np.abs(g - ours).max() <= 1e-8


def test_ase_forces_of_a_doublet_against_its_energy():
    """ASE forces of OH (the Atoms' magnetic moment makes the doublet) against central
    differences of the calculator's own energy (eV/Å), one component."""
    ase = pytest.importorskip("ase", reason="the ASE calculator needs `pip install ase` (the test extra has it)")
    from ase import Atoms

    from dfmp2.ase import DFMP2Calculator

    def atoms_at(dz):
        a = Atoms("OH", positions=[(0.01, -0.02, 0.0), (0.0, 0.03, 0.97 + dz)], magmoms=[1.0, 0.0])
        a.calc = DFMP2Calculator(basis="6-31g", scf_conv_tol_grad=1e-10)
        return a

    f = atoms_at(0.0).get_forces()
    h = 5e-4  # Å (about STEP bohr: OH's stretch is stiff, 1e-3 Å's own error is 1.2e-6 Eh/bohr)
    e = [atoms_at(s * h).get_potential_energy() for s in (1, -1)]
    assert abs(-(e[0] - e[1]) / (2 * h) - f[1, 2]) <= 1e-6 * ase.units.Hartree / ase.units.Bohr
    assert np.abs(f.sum(axis=0)).max() < 1e-8


@pytest.mark.cuda
def test_uhf_gradient_on_cuda_equals_cpu():
    """The UHF stage on a CUDA backend (its GEMMs and J/K there, fp64) against the CPU's."""
    geom = _radical("nh2")
    cpu = gradient_driver.run_gradient(geom, _options(basis="6-31g", frozen_core=True))
    gpu = gradient_driver.run_gradient(geom, _options(basis="6-31g", frozen_core=True, device="cuda"))
    assert gpu.parts.ran["device"].startswith("cuda") and gpu.parts.ran["kernels"]
    assert np.abs(gpu.gradient - cpu.gradient).max() <= 1e-8
