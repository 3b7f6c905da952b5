"""The RHF DF-MP2 nuclear gradient (dfmp2.grad.mp2) against references that do not come from it:
central finite differences of our own printed energies (``dfmp2.interfaces.api.run``, both fitting
sets, SCF converged to 1e-10), with the step shown converged (two steps agree far below the
tolerance), and PySCF's DF-RHF gradient (``pyscf.df.grad.rhf``) for the HF part. Geometries are
distorted from the symmetric inputs so that no component vanishes by symmetry."""

import dataclasses
import json

import numpy as np
import pytest
from channels import heavy_cases
from click.testing import CliRunner
from gradient_fd import (
    INPUTS,
    assert_dropin_matches_fd_along,
    assert_matches_fd,
    assert_matches_fd_along,
    distorted,
    energy,
)
from gradient_fd import options as _options
from pyscf.data.nist import BOHR

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.errors import EXIT_USER_ERROR, InputError
from dfmp2.grad import mp2 as grad_mp2
from dfmp2.grad import plan as grad_plan
from dfmp2.interfaces import api
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small problems: one thread is faster


def _geometry(name: str):
    return distorted(read_xyz(INPUTS / name))


CASES = {  # name: (xyz, options, method)
    "water-mp2": ("water.xyz", dict(basis="6-31g"), "mp2"),
    "ammonia-fc-scs": ("ammonia.xyz", dict(basis="6-31g", frozen_core=True), "scs-mp2"),
}
_cache = {}


def _analytic(case):
    if case not in _cache:
        xyz, kw, method = CASES[case]
        geom = _geometry(xyz)
        _cache[case] = (geom, _options(**kw), method, gradient_driver.run_gradient(geom, _options(**kw), method=method))
    return _cache[case]


@pytest.mark.parametrize("case", heavy_cases(sorted(CASES), {"ammonia-fc-scs"}))
def test_gradient_matches_finite_differences_per_component(case):
    geom, options, method, gr = _analytic(case)
    g = gr.gradient
    # the step is converged: halving it changes the largest-curvature components far below TOL
    assert_matches_fd(g, geom, options, method, also=[(0, 2)])
    assert np.abs(g).min() > 1e-4  # no component is zero by symmetry: each is a test


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient_differentiates_the_printed_energy(case):
    _, _, method, gr = _analytic(case)
    c_os, c_ss = grad_mp2.SCALES[method]
    assert gr.parts.e_corr == pytest.approx(c_os * gr.result.e_os + c_ss * gr.result.e_ss, abs=1e-10)
    assert gr.energy == pytest.approx(gr.result.e_hf + c_os * gr.result.e_os + c_ss * gr.result.e_ss, abs=1e-12)


@pytest.mark.parametrize("case", sorted(CASES))
def test_translation_and_rotation_invariance(case):
    """The energy of an isolated molecule does not change under a rigid translation or rotation:
    the gradient sums to zero and exerts no torque."""
    geom, _, _, gr = _analytic(case)
    g = gr.gradient
    r = geom.coords_angstrom / BOHR
    assert np.abs(g.sum(axis=0)).max() < 1e-9
    assert np.abs(np.cross(r, g).sum(axis=0)).max() < 1e-8


@pytest.mark.parametrize("case", sorted(CASES))
def test_hf_part_matches_pyscf_df_rhf_gradient(case):
    """The HF part against PySCF's DF-RHF gradient on the same JK-fit set and orbitals."""
    from pyscf import scf as pyscf_scf
    from pyscf.df.grad import rhf as df_rhf_grad

    geom, options, _method, _ = _analytic(case)
    seen = {}
    api.run(geom, options, on_reference=lambda mol, ref: seen.update(mol=mol, ref=ref))
    mol, ref = seen["mol"], seen["ref"]
    parts = grad_mp2.mp2_gradient(
        mol,
        ref,
        basis.make_auxmol(mol, basis.mp2_auxbasis(mol)),
        basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk")),
        linalg.get_backend("cpu"),
    )
    ch = ref.channels[0]
    mf = pyscf_scf.RHF(mol).density_fit(auxbasis=basis.default_auxbasis(mol, "jk"))
    mf.mo_coeff, mf.mo_energy = ch.mo_coeff, ch.mo_energy
    mf.mo_occ = np.where(np.arange(ch.nmo) < ch.nocc, 2.0, 0.0)
    mf.e_tot, mf.converged = ref.e_hf, True
    g_pyscf = df_rhf_grad.Gradients(mf).kernel()
    assert np.abs(parts.hf - g_pyscf).max() <= 1e-8


@pytest.mark.parametrize("method, scf_mode", [("sos-mp2", "df"), ("mp2", "pyscf-df")])
def test_along_a_direction(method, scf_mode):
    """SOS-MP2 (no same-spin part), and PySCF's DF-RHF as the reference (the same JK-fit set),
    along one displacement of all atoms at once."""
    geom = _geometry("water.xyz")
    options = _options(basis="6-31g", scf_mode=scf_mode)
    gr = gradient_driver.run_gradient(geom, options, method=method)
    d = np.random.default_rng(7).normal(size=gr.gradient.shape)
    d /= np.linalg.norm(d)
    assert_matches_fd_along(gr.gradient, geom, options, method, d)


def test_dropin_nuc_grad_method_matches_its_finite_differences():
    """dfmp2.DFMP2(mf).nuc_grad_method().kernel() on a PySCF DF-RHF with frozen core: the
    derivative of PySCF's DF-RHF energy plus our DF-MP2 on PySCF's fitting set."""
    from pyscf import gto
    from pyscf import scf as pyscf_scf

    def mf_at(coords):
        mol = gto.M(atom=[("O", coords[0]), ("H", coords[1]), ("H", coords[2])], unit="Bohr", basis="6-31g")
        mf = pyscf_scf.RHF(mol).density_fit()
        mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-13, 1e-10, 0
        return mf.run()

    assert_dropin_matches_fd_along(mf_at, _geometry("water.xyz").coords_angstrom / BOHR, seed=3)


def test_dropin_refuses_an_exact_integral_mf():
    from pyscf import gto
    from pyscf import scf as pyscf_scf

    import dfmp2

    mf = pyscf_scf.RHF(gto.M(atom="H 0 0 0; H 0 0 0.74", basis="6-31g", verbose=0)).run()
    with pytest.raises(InputError, match="density-fitted mf"):
        dfmp2.DFMP2(mf).nuc_grad_method().kernel()


def test_api_gradient_returns_the_result_with_the_gradient():
    import dfmp2

    gr = dfmp2.gradient(str(INPUTS / "water.xyz"), basis="sto-3g")
    assert gr.gradient.shape == (3, 3)
    d = gr.to_dict()
    assert d["units"]["gradient"] == "hartree/bohr" and np.array(d["gradient"]["gradient"]).shape == (3, 3)
    assert d["energies"]["e_mp2"] == pytest.approx(gr.energy, abs=1e-12)
    g = d["gradient"]  # schema 4 on: the stage's flops beside its timings; the factor's fit is in grad_jk_factor
    assert list(g["flops"]) == list(g["timings"]) and d["schema_version"] == "12"
    assert all(g["flops"][s] > 0 for s in ("grad_jk_factor", "grad_mp2_densities", "grad_zvector"))


def test_cli_gradient_prints_the_table_and_writes_json(tmp_path):
    out = tmp_path / "g.json"
    r = CliRunner().invoke(main, ["gradient", str(INPUTS / "water.xyz"), "--basis", "sto-3g", "-q", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "nuclear gradient of E(MP2)" in r.output
    d = json.loads(out.read_text())
    g = np.array(d["gradient"]["gradient"])
    assert g.shape == (3, 3) and d["units"]["gradient"] == "hartree/bohr"
    assert d["gradient"]["method"] == "mp2" and d["gradient"]["ran"]["reference"] == "rhf"

    def keys(x):
        if isinstance(x, dict):
            return [k for k, v in x.items() for k in [k] + keys(v)]
        return [k for v in x for k in keys(v)] if isinstance(x, list) else []

    assert not [k for k in keys(d) if "." in k]  # schema 3: kernel maps as records
    recs = d["gradient"]["ran"]["kernels"]
    assert recs and all(set(r) == {"op", "kernel", "calls"} and r["calls"] > 0 for r in recs)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--reference", "rohf"], "ROHF references are not supported"),
        (["--scf", "exact"], "density-fitted SCF"),
        (["--device", "trn1", "--simulate", "--reference", "uhf"], "UHF DF-MP2 gradient needs fp64"),
        (["--precision", "fp32"], "use precision fp64 (--precision)"),
        (["--basis", "cc-pv[dt]z"], "basis bracket"),
    ],
)
def test_cli_gradient_refuses_in_one_line_before_the_scf(args, words, no_scf):
    r = CliRunner().invoke(main, ["gradient", str(INPUTS / "water.xyz"), "--basis", "sto-3g", *args])
    assert r.exit_code == EXIT_USER_ERROR, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and words in lines[0], r.output


SLOW_CASES = {  # per component, as above: an ECP (HI, def2-SVP), a low-symmetry molecule, cc-pVDZ
    "water-cc-pvdz": ("water.xyz", dict(basis="cc-pvdz"), "mp2"),
    "hi-ecp": ("ecp/hydrogen_iodide.xyz", dict(basis="def2-svp"), "mp2"),
    "glycine-fc": ("glycine.xyz", dict(basis="cc-pvdz", frozen_core=True), "mp2"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SLOW_CASES))
def test_gradient_matches_finite_differences_slow(case):
    xyz, kw, method = SLOW_CASES[case]
    geom = distorted(read_xyz(INPUTS / xyz))
    options = _options(**kw)
    g = gradient_driver.run_gradient(geom, options, method=method).gradient
    assert_matches_fd(g, geom, options, method)


DISTORTED_WATER = "3\ndistorted water: OH 1.1 A, HOH 120 deg\nO 0 0 0\nH 0 0.952627944 0.55\nH 0 -0.952627944 0.55\n"


@pytest.mark.heavy
def test_optimize_water_to_the_dfmp2_cc_pvdz_minimum(tmp_path):
    """From OH 1.1 Å, HOH 120°: converged with max |g| <= 3e-4 Eh/bohr, and no point of a scan
    around the final geometry (each bond and the angle, ± 0.01 bohr / 0.5°) lies lower."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    src = tmp_path / "w.xyz"
    src.write_text(DISTORTED_WATER)
    final, traj = tmp_path / "w.opt.xyz", tmp_path / "w.traj.xyz"
    r = CliRunner().invoke(
        main,
        [
            "optimize",
            str(src),
            "--basis",
            "cc-pvdz",
            "--scf-conv-tol-grad",
            "1e-10",
            "-o",
            str(final),
            "--trajectory",
            str(traj),
            "-q",
        ],
    )
    assert r.exit_code == 0, r.output
    geom = read_xyz(final)
    assert sum(ln.startswith("step ") for ln in traj.read_text().splitlines()) >= 2
    gr = gradient_driver.run_gradient(geom, _options(basis="cc-pvdz"))
    assert np.abs(gr.gradient).max() <= 3e-4
    options = _options(basis="cc-pvdz")
    c = geom.coords_angstrom
    for scan in _water_scan(c):
        assert energy(geom, options, "mp2", scan) >= gr.energy - 1e-10


def _water_scan(c):
    """Geometries around water c (O, H, H; Å): each O-H bond ± 0.01 bohr, the angle ± 0.5°."""
    out = []
    for h in (1, 2):
        for s in (1, -1):
            d = c.copy()
            u = (c[h] - c[0]) / np.linalg.norm(c[h] - c[0])
            d[h] += s * 0.01 * BOHR * u
            out.append(d)
    axis = np.cross(c[1] - c[0], c[2] - c[0])
    axis /= np.linalg.norm(axis)
    for s in (1, -1):
        t = np.radians(0.25 * s)
        d = c.copy()
        for h, sign in ((1, 1), (2, -1)):  # open or close the angle symmetrically
            v = c[h] - c[0]
            k = axis * sign
            d[h] = c[0] + v * np.cos(t) + np.cross(k, v) * np.sin(t) + k * np.dot(k, v) * (1 - np.cos(t))
        out.append(d)
    return out


def test_optimize_not_converged_is_one_line_and_writes_the_last_geometry(tmp_path):
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    src = tmp_path / "w.xyz"
    src.write_text(DISTORTED_WATER)
    final = tmp_path / "last.xyz"
    r = CliRunner().invoke(
        main,
        [
            "optimize",
            str(src),
            "--basis",
            "sto-3g",
            "--max-steps",
            "2",
            "-o",
            str(final),
            "--trajectory",
            str(tmp_path / "t.xyz"),
            "--json",
            str(tmp_path / "o.json"),
        ],
    )
    assert r.exit_code == EXIT_USER_ERROR
    lines = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "did not converge in 2 steps" in lines[0], r.output
    assert read_xyz(final).natm == 3 and "not converged" in final.read_text()
    frames = [ln for ln in (tmp_path / "t.xyz").read_text().splitlines() if ln.startswith("step ")]
    assert len(frames) == 2  # --max-steps counts evaluations: 2, not 3
    d = json.loads((tmp_path / "o.json").read_text())  # the steps so far, for a script
    assert d["optimization"]["converged"] is False and d["optimization"]["steps"] == 2


def test_optimize_refuses_colliding_outputs_and_bad_molecules(tmp_path):
    """Output paths that are one file, coincident atoms: one error line before any work (exit 2);
    a single atom has nothing to optimise: its one evaluation, converged."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    src = tmp_path / "w.xyz"
    src.write_text(DISTORTED_WATER)
    x = str(tmp_path / "x.xyz")
    for extra, what in (
        (["-o", x, "--trajectory", x], "--trajectory file"),
        (["-o", x, "--json", x], "--json file"),
        (["--json", str(src)], "is the input"),
    ):
        r = CliRunner().invoke(main, ["optimize", str(src), "--basis", "sto-3g", "-q", *extra])
        err = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.exit_code == EXIT_USER_ERROR and len(err) == 1 and what in err[0], (extra, r.output)
    assert not (tmp_path / "x.xyz").exists()
    twin = tmp_path / "twin.xyz"
    twin.write_text("3\n\nO 0 0 0\nH 0 0 0\nH 0 0.7 0.7\n")
    r = CliRunner().invoke(main, ["optimize", str(twin), "--basis", "sto-3g", "-q", "-o", x])
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.exit_code == EXIT_USER_ERROR and len(err) == 1 and err[0].startswith("error:"), r.output
    assert "Traceback" not in r.output
    atom = tmp_path / "ne.xyz"
    atom.write_text("1\n\nNe 0 0 0\n")
    out = tmp_path / "ne.json"
    r = CliRunner().invoke(main, ["optimize", str(atom), "--basis", "6-31g", "-q", "-o", x, "--json", str(out)])
    assert r.exit_code == 0, r.output
    d = json.loads(out.read_text())
    assert d["optimization"]["converged"] is True and d["optimization"]["steps"] == 1


def test_optimize_starts_each_scf_from_the_previous_density(tmp_path):
    """Every step after the first starts its SCF from the previous step's density, and ends at
    the energy a fresh run at that geometry gives (to 1e-9 Eh)."""
    pytest.importorskip("geometric", reason="dfmp2 optimize needs geomeTRIC (the test extra has it)")
    from dfmp2.workflows.optimize import optimize

    src = tmp_path / "w.xyz"
    src.write_text(DISTORTED_WATER)
    out = optimize(read_xyz(src), _options(basis="sto-3g"))
    assert len(out.energies) >= 3
    assert out.last.result.ran["scf"]["guess"].startswith("given density")
    fresh = gradient_driver.run_gradient(out.geometry, _options(basis="sto-3g"))
    assert fresh.result.ran["scf"]["guess"].startswith("minao")
    assert abs(fresh.energy - out.last.energy) < 1e-9


def test_bench_gradient_script_writes_its_record(tmp_path):
    """scripts/bench_gradient.py on a tiny input: both rows, the ratio, what ran."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gradient", INPUTS.parent / "scripts" / "bench_gradient.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(INPUTS / "water.xyz"), "--basis", "sto-3g", "--no-warmup", "--out", str(tmp_path)]) == 0
    rec = json.loads((tmp_path / "gradient_water.json").read_text())
    assert set(rec["times"]) == {"energy", "gradient", "gradient_stage"}
    assert rec["ratio_gradient_over_energy"] > 0 and rec["ran"]["device"] == "cpu"


def test_qcschema_driver_gradient_returns_the_n_by_3_gradient():
    """A v1 AtomicInput with driver 'gradient': return_result and properties.return_gradient are
    the gradient `dfmp2 gradient` computes for the same molecule (Hartree/Bohr, the input's order)."""
    pytest.importorskip("qcelemental", reason="QCSchema needs qcelemental (the qcschema extra)")
    from dfmp2.interfaces import qcschema

    geom = _geometry("water.xyz")
    doc = {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "gradient",
        "model": {"method": "mp2", "basis": "6-31g"},
        "keywords": {"frozen_core": True},
        "molecule": {
            "symbols": list(geom.symbols),
            "geometry": (geom.coords_angstrom / BOHR).ravel().tolist(),
            "molecular_charge": 0,
            "molecular_multiplicity": 1,
            "fix_com": True,
            "fix_orientation": True,
        },
    }
    r = qcschema.run_qcschema(doc)
    g = np.asarray(r.return_result).reshape(-1, 3)
    ours = gradient_driver.run_gradient(geom, RunOptions(basis="6-31g", frozen_core=True)).gradient
    assert r.driver == "gradient" and g.shape == (3, 3)
    assert np.abs(g - ours).max() <= 1e-8
    assert np.allclose(np.asarray(r.properties.return_gradient).reshape(-1, 3), g)


@pytest.mark.cuda
def test_gradient_on_cuda_equals_cpu():
    """The stage on a CUDA backend (its GEMMs and J/K there, fp64) against the CPU's."""
    geom = _geometry("water.xyz")
    cpu = gradient_driver.run_gradient(geom, _options(basis="6-31g", frozen_core=True))
    gpu = gradient_driver.run_gradient(geom, _options(basis="6-31g", frozen_core=True, device="cuda"))
    assert gpu.parts.ran["device"].startswith("cuda") and gpu.parts.ran["kernels"]
    assert np.abs(gpu.gradient - cpu.gradient).max() <= 1e-8


def test_gradient_memory_is_refused_before_the_scf(no_scf):
    """A memory limit above the energy run's need but below the gradient stage's: one line, exit 2,
    before any SCF."""
    need = gradient_driver.check_gradient_memory(
        read_xyz(INPUTS / "water.xyz"),
        RunOptions(basis="cc-pvdz", memory_mb=1e5),
        energy_driver.make_backend(RunOptions()),
    )
    assert need == pytest.approx(grad_plan.memory_mb(nao=24, nocc=5, nact=5, nvir=19, naux_mp2=84, naux_jk=116))
    r = CliRunner().invoke(main, ["gradient", str(INPUTS / "water.xyz"), "--memory", f"{need / 2:.3f}MB"])
    assert r.exit_code == EXIT_USER_ERROR and "the gradient stage needs about" in r.output, r.output


def test_linear_dependence_is_said():
    """With orbitals dropped by the canonical orthogonalisation the gradient misses the kept
    space's change (H2 at 0.25 Å, aug-cc-pVTZ: 2e-5 Eh/bohr off its finite difference): a warning
    says so, in the result's JSON too."""
    geom = dataclasses.replace(
        read_xyz(INPUTS / "water.xyz"),
        symbols=("H", "H"),
        coords_angstrom=np.array([[0.0, 0.0, 0.0], [0.0, 0.0, 0.25]]),
    )
    gr = gradient_driver.run_gradient(geom, _options(basis="aug-cc-pvtz"))
    assert gr.result.nmo < gr.result.nbasis
    assert any("linear dependence" in w and "not the exact derivative" in w for w in gr.to_dict()["warnings"])
