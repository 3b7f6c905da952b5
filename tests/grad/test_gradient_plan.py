"""The RHF gradient's memory plan (dfmp2.grad.plan.choose_plan): its bounded forms against the
in-memory ones (the Z-vector's J/K streamed from the AO factor, the JK derivative per aux block),
the choice under a limit, and the refusal below the smallest plan. The in-memory forms are checked
against finite differences in test_gradient.py; here the blocked ones must equal them."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from gradient_fd import INPUTS, distorted
from gradient_fd import options as _options

from dfmp2.cli.main import main
from dfmp2.drivers import energy as energy_driver
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.errors import EXIT_USER_ERROR, MemoryLimitError
from dfmp2.grad import common as grad_common
from dfmp2.grad import jk_deriv
from dfmp2.grad import mp2 as grad_mp2
from dfmp2.grad import plan as grad_plan
from dfmp2.io.xyz import read_xyz
from dfmp2.memory import human
from dfmp2.timing import Timer

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H2O_16 = dict(nao=384, nocc=80, nact=80, nvir=304, naux_mp2=1344, naux_jk=1856)  # cc-pVDZ, its RI and JKFIT sets
_runs = {}


def _energy_run(name: str, **kw):
    if name not in _runs:
        opts = _options(**kw)
        be = energy_driver.make_backend(opts)
        job = energy_driver.prepare(distorted(read_xyz(INPUTS / name)), opts, be, None)
        _runs[name] = (job, energy_driver.run_energy(job), be)
    return _runs[name]


@pytest.mark.parametrize(
    "name, kw, method",
    [("water.xyz", dict(basis="6-31g"), "mp2"), ("ammonia.xyz", dict(basis="6-31g", frozen_core=True), "scs-mp2")],
)
def test_blocked_forms_equal_the_in_memory_forms(name, kw, method):
    job, done, be = _energy_run(name, **kw)
    shapes = grad_plan.rhf_shapes(job.mol, done.ref, job.auxmol, job.jk_auxmol)
    grads = {}
    row_mb = (shapes["nao"] * (shapes["nao"] + 1) // 2) * 8 / 1e6
    forms = [(zv, jd, "memory", 0.0) for zv, jd in grad_plan.PLANS] + [(*grad_plan.DISK_PLAN, "disk", 7 * row_mb)]
    for zv, jd, factor, fit_mb in forms:  # on disk: fitted in row blocks of 7 functions
        plan = grad_plan.make_plan(shapes, zv, jd, factor=factor, fit_mb=fit_mb)
        parts = gradient_driver.gradient_stage(
            job.mol, done.ref, job.auxmol, job.jk_auxmol, be, method, Timer(be), plan
        )
        assert parts.ran["plan"]["zvector"] == zv and parts.ran["plan"]["jk_deriv"] == jd
        assert parts.zvector["form"] == zv and parts.ran["plan"]["jk_factor"].startswith(("in memory", "on disk"))
        grads[zv, jd, factor] = parts.gradient
    for key, g in grads.items():
        assert np.abs(g - grads["mo", "mo", "memory"]).max() <= 1e-10, key


@pytest.mark.parametrize("name, kw, method", [("open_shell/hydroxyl.xyz", dict(basis="6-31g"), "scs-mp2")])
def test_uhf_factor_on_disk_equals_the_factor_in_memory(name, kw, method):
    """The UHF stage's plan with the JK factor on disk (fitted in row blocks of 7 functions, the
    Z-vector's J/K and the JK derivative read from the file per block) against its in-memory
    plan, and both record the UHF's forms."""
    job, done, be = _energy_run(name, **kw)
    shapes = grad_plan.uhf_shapes(job.mol, done.ref, job.auxmol, job.jk_auxmol)
    row_mb = (shapes["nao"] * (shapes["nao"] + 1) // 2) * 8 / 1e6
    grads = {}
    for factor, fit_mb in (("memory", 0.0), ("disk", 7 * row_mb)):
        plan = grad_plan.make_plan(shapes, *grad_plan.DISK_PLAN, factor=factor, fit_mb=fit_mb)
        parts = gradient_driver.gradient_stage(
            job.mol, done.ref, job.auxmol, job.jk_auxmol, be, method, Timer(be), plan
        )
        rec = parts.ran["plan"]
        assert rec["jk_factor"].startswith("in memory" if factor == "memory" else "on disk")
        assert rec["zvector_form"] == grad_plan.UHF_FORMS["zvector"] and "each spin" in rec["jk_deriv_form"]
        grads[factor] = parts.gradient
    assert np.abs(grads["disk"] - grads["memory"]).max() <= 1e-10


def test_uhf_plan_goes_to_disk_under_a_small_limit():
    """(H2O)16+ doublet/cc-pVDZ shapes: the in-memory UHF plan needs more than 2 GB; under 2 GB the
    factor goes to disk and every phase stays within the limit; the only in-memory forms are the
    UHF's (the RHF's MO-factor forms do not exist for it)."""
    shapes = dict(H2O_16, nocc=(80, 79), nact=(80, 79), nvir=(304, 305))
    fast = grad_plan.choose_plan(shapes, 1e6)
    assert (fast.zvector, fast.jk_deriv, fast.factor, fast.reference) == ("ao", "blocked", "memory", "uhf")
    assert fast.peak_mb > 2000.0
    disk = grad_plan.choose_plan(shapes, 2000.0)
    assert disk.factor == "disk" and disk.peak_mb <= 2000.0 and disk.reference == "uhf"
    with pytest.raises(ValueError):
        grad_plan.make_plan(shapes, "mo", "mo")
    with pytest.raises(MemoryLimitError) as err:
        grad_plan.choose_plan(shapes, 300.0)
    assert "\n" not in str(err.value) and "smallest plan" in str(err.value)


def test_over_ranks_the_split_factor_comes_after_the_whole_factor_plans_and_before_the_disk():
    """(H2O)16/cc-pVDZ: at 2 GB no whole-factor plan fits (the lean one needs 2.44 GB, its fit the
    peak); over 2 ranks (1160 of the 1856 rows on the busiest, jk_dist.planned_rows) the split
    factor does, in one process the disk plan is next. With room, an RHF keeps the whole factor
    over ranks too (its MO forms: one process's bits); a UHF, whose one in-memory form is the
    split plan's, splits it first."""
    lean = grad_plan.make_plan(H2O_16, *grad_plan.DISK_PLAN)
    assert lean.peak_mb > 2000.0 and lean.largest == "jk_fit"
    split = grad_plan.choose_plan(H2O_16, 2000.0, split_rows=1160)
    assert split.factor == "split" and split.peak_mb <= 2000.0 and split.jk_rows == 1160
    rec = split.record()
    assert rec["jk_factor"].startswith("split over the ranks") and rec["jk_rows_per_rank"] == 1160
    assert grad_plan.choose_plan(H2O_16, 2000.0).factor == "disk"
    roomy = grad_plan.choose_plan(H2O_16, 1e6, split_rows=1160)
    assert (roomy.zvector, roomy.jk_deriv, roomy.factor) == ("mo", "mo", "memory")
    smaller = grad_plan.make_plan(H2O_16, *grad_plan.DISK_PLAN, factor="split", jk_rows=696).phases
    assert smaller["jk_fit"] < split.phases["jk_fit"] and smaller["densities"] == split.phases["densities"]
    with pytest.raises(ValueError):
        grad_plan.make_plan(H2O_16, "mo", "mo", factor="split", jk_rows=1160)
    with pytest.raises(ValueError):
        grad_plan.make_plan(H2O_16, *grad_plan.DISK_PLAN, factor="split")  # no rows
    uhf = dict(H2O_16, nocc=(80, 79), nact=(80, 79), nvir=(304, 305))  # its one in-memory form is split's
    assert grad_plan.choose_plan(uhf, 1e6, split_rows=1160).factor == "split"
    assert grad_plan.choose_plan(uhf, 1e6).factor == "memory"


def test_a_split_factor_needs_ranks():
    job, _, be = _energy_run("water.xyz", basis="6-31g")
    with pytest.raises(ValueError, match="several ranks"):
        jk_deriv.DFJK(job.mol, job.jk_auxmol, be, Timer(be), factor="split")


def test_ao_hessian_and_g_equal_the_mo_factor_ones():
    """The AO-streamed products against the MO factor's on random arguments, to rounding."""
    job, done, be = _energy_run("water.xyz", basis="6-31g")
    orb = grad_common.Orbitals(done.ref.channels[0])
    C_o, C_v = orb.C[:, orb.occ], orb.C[:, orb.vir]
    jk = jk_deriv.DFJK(job.mol, job.jk_auxmol, be, Timer(be))
    rng = np.random.default_rng(7)
    z = rng.standard_normal((len(orb.vir), len(orb.occ)))
    P = rng.standard_normal((orb.nmo, orb.nmo))
    jk.build_mo(C_o, C_v)
    mo = (jk.mo_hessian()(z), jk.G(P), jk.G(P, vir_rows=False))
    jk.use_ao(C_o, C_v)
    ao = (jk.ao_hessian()(z), jk.G(P), jk.G(P, vir_rows=False))
    for a, m in zip(ao, mo):
        assert a.shape == m.shape and np.abs(a - m).max() <= 1e-12 * max(1.0, np.abs(m).max())


def test_trsm_columns_solves_in_place():
    L = torch.tril(torch.rand(30, 30, dtype=torch.float64)) + 3 * torch.eye(30, dtype=torch.float64)
    X = torch.rand(30, 50, dtype=torch.float64)
    want = torch.linalg.solve_triangular(L.T, X, upper=True)
    ptr = X.data_ptr()
    jk_deriv.trsm_columns(L, X, None, block_mb=30 * 7 * 8 / 1e6)  # 7 columns a block
    assert X.data_ptr() == ptr and torch.allclose(X, want, rtol=1e-13, atol=1e-13)


def test_plan_picks_the_fastest_that_fits_and_blocked_forms_under_a_small_limit():
    peaks = {(zv, jd): grad_plan.memory_mb(**H2O_16, zvector=zv, jk_deriv=jd) for zv, jd in grad_plan.PLANS}
    assert peaks["mo", "mo"] > peaks["mo", "blocked"] > peaks["ao", "blocked"]  # each step saves
    assert grad_plan.memory_mb(**H2O_16) == peaks["mo", "mo"]  # the default is the fastest
    fast = grad_plan.choose_plan(H2O_16, 1e6)
    assert (fast.zvector, fast.jk_deriv) == ("mo", "mo")
    mid = grad_plan.choose_plan(H2O_16, peaks["mo", "blocked"] + 1)
    assert (mid.zvector, mid.jk_deriv) == ("mo", "blocked")
    small = grad_plan.choose_plan(H2O_16, peaks["ao", "blocked"] + 1)
    assert (small.zvector, small.jk_deriv, small.factor) == ("ao", "blocked", "memory")
    assert small.record()["peak_mb"] == pytest.approx(peaks["ao", "blocked"], abs=0.1)
    disk = grad_plan.choose_plan(H2O_16, 1500.0)  # the limit: only with the JK factor on disk
    assert disk.factor == "disk" and disk.peak_mb <= 1500.0 and disk.record()["jk_factor"].startswith("on disk")


def test_below_the_smallest_plan_is_one_line_in_human_units():
    small = grad_plan.make_plan(H2O_16, *grad_plan.DISK_PLAN, factor="disk", fit_mb=1e-9).peak_mb
    with pytest.raises(MemoryLimitError) as err:
        grad_plan.choose_plan(H2O_16, 600.0)
    msg = str(err.value)
    assert "\n" not in msg and "600 MB" in msg and human(small) in msg and "smallest plan" in msg
    assert err.value.need_mb == pytest.approx(small)
    assert human(3652.0) == "3.65 GB" and human(512.0) == "512 MB"


def test_cli_refuses_below_the_smallest_plan_before_the_scf(no_scf):
    geom, opts = read_xyz(INPUTS / "water.xyz"), _options(basis="cc-pvdz")
    job = energy_driver.prepare(geom, opts, energy_driver.make_backend(opts))
    shapes = dict(
        nao=job.space.nbasis,
        nocc=job.space.nocc[0],
        nact=job.space.nocc[0] - job.space.nfrozen,
        nvir=job.space.nmo - job.space.nocc[0],
        naux_mp2=job.space.naux,
        naux_jk=job.jk_auxmol.nao_nr(),
    )
    small = min(grad_plan.memory_mb(**shapes, zvector=zv, jk_deriv=jd) for zv, jd in grad_plan.PLANS)
    r = CliRunner().invoke(main, ["gradient", str(INPUTS / "water.xyz"), "--memory", f"{small * 0.9:.4f}MB"])
    errors = [ln for ln in r.output.splitlines() if ln.startswith("error:")]
    assert r.exit_code == EXIT_USER_ERROR and len(errors) == 1, r.output
    assert "smallest plan" in errors[0] and "MB" in errors[0] and "Traceback" not in r.output, r.output


@pytest.mark.parametrize("xyz", ["water.xyz", "open_shell/hydroxyl.xyz"], ids=["rhf", "uhf"])
def test_water_gradient_runs_at_50_mb(tmp_path, xyz):
    """A fixed 128 MB floor in the estimate refused water at --memory 50MB, though the
    gradient stage's RSS grows by about 10 MB (water/cc-pVDZ, one thread: 9.6 MB measured from
    /proc/self/statm every 2 ms against a 5.3 MB plan, the rest libcint's derivative buffers and
    modules loaded on first use; (H2O)4: +239 MB against a 339 MB plan). The RHF and UHF stages
    both run there and write the gradient."""
    out = tmp_path / "g.json"
    args = ["gradient", str(INPUTS / xyz), "--memory", "50MB", "--cpu-blas", "torch", "-q", "--json", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["memory"]["limit_mb"] == 50.0 and len(doc["gradient"]["gradient"]) == 2 + xyz.startswith("water")
    plan = doc["gradient"]["ran"]["plan"]
    assert plan["factor"] == "memory" and plan["limit_mb"] == 50.0
    caption = " ".join(r.output.split())  # the table's caption, folded to the terminal's width
    assert f"memory plan {human(plan['peak_mb'])} of 50 MB, JK factor in memory" in caption, r.output


def test_run_gradient_under_a_limit_runs_and_records_the_blocked_plan(monkeypatch):
    """A limit between the fastest and the smallest plan's peak: the run chooses the bounded forms
    (here forced by making the in-memory ones look large) and says so in its result."""
    real = grad_plan.phase_mb

    def inflated(**kw):
        out = real(**kw)
        if kw.get("zvector", "mo") == "mo":
            out["zvector"] += 1e9  # beyond any machine
        return out

    monkeypatch.setattr(grad_plan, "phase_mb", inflated)
    geom, opts = distorted(read_xyz(INPUTS / "water.xyz")), _options(basis="6-31g", memory_mb=2e4)
    gr = gradient_driver.run_gradient(geom, opts)
    plan = gr.to_dict()["gradient"]["ran"]["plan"]
    assert plan["zvector"] == "ao" and plan["jk_deriv"] == "blocked" and plan["limit_mb"] == 2e4
    job, done, be = _energy_run("water.xyz", basis="6-31g")
    ref = grad_mp2.mp2_gradient(job.mol, done.ref, job.auxmol, job.jk_auxmol, be, plan=None)
    assert ref.ran["plan"]["zvector"] == "ao"  # the default limit sees the same inflated phases


def test_the_disk_plan_uses_the_runs_scratch_directory_and_leaves_it_empty(monkeypatch, tmp_path):
    """The plan with the JK factor on disk (forced: every in-memory plan made to look large) writes
    the factor under the run's --scratch and removes it; the gradient equals the in-memory one."""
    real = grad_plan.phase_mb

    def inflated(**kw):
        out = real(**kw)
        if kw.get("factor", "memory") == "memory":
            out["zvector"] += 1e9
        return out

    seen = []
    real_build = jk_deriv.build_jk_factor

    def build(*a, **k):
        fac = real_build(*a, **k)
        seen.append((k.get("layout"), [p.name for p in tmp_path.iterdir()]))
        return fac

    monkeypatch.setattr(jk_deriv, "build_jk_factor", build)
    monkeypatch.setattr(grad_plan, "phase_mb", inflated)
    geom = distorted(read_xyz(INPUTS / "water.xyz"))
    gr = gradient_driver.run_gradient(geom, _options(basis="6-31g", memory_mb=2e4, scratch_dir=str(tmp_path)))
    assert gr.to_dict()["gradient"]["ran"]["plan"]["jk_factor"].startswith("on disk")
    assert ("disk", seen[-1][1]) == seen[-1] and seen[-1][1]  # the factor's directory under --scratch
    assert not list(tmp_path.iterdir())
    monkeypatch.setattr(grad_plan, "phase_mb", real)
    mem = gradient_driver.run_gradient(geom, _options(basis="6-31g"))
    assert np.abs(np.asarray(gr.gradient) - np.asarray(mem.gradient)).max() <= 1e-10


def test_over_ranks_the_default_limit_is_the_smallest_rank_s(monkeypatch):
    """Without --memory each rank sees its own free memory; the plan is made for the smallest
    of the ranks' limits (gathered), so every rank runs the same forms (same steps, same bits)."""
    from dfmp2 import memory
    from dfmp2.grad import relaxed

    job, _, _ = _energy_run("water.xyz", basis="6-31g")

    class TwoRanks:  # this rank sees 1e6 MB; the other one 800 MB less
        distributed = True
        scf_split = False  # the replicated SCF: no split JK factor in the gradient's plans

        def gather_objects(self, obj, stage):
            assert stage == "plan"
            return [obj, obj - 800.0]

    monkeypatch.setattr(memory, "default_limit_mb", lambda device: 1e6)
    monkeypatch.setattr(job, "world", TwoRanks())
    assert relaxed.job_plan(job, None).limit_mb == 1e6 - 800.0
    assert relaxed.job_plan(job, 5000.0).limit_mb == 5000.0  # --memory: the same on every rank, no gather
