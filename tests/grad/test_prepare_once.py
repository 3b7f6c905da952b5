"""One preparation per gradient run: ``prepare`` runs once, and with it the cheap checks
(``check_choices``, ``resolve_reference``, ``make_backend``); the JK-fit set
(``default_auxbasis(mol, 'jk')``) is chosen once (in ``prepare``: the plan, both SCF engines, the
gradient memory check and the gradient stage read ``Job.jk_auxbasis``/``Job.jk_auxmol``), and every
way into the gradient (``dfmp2.gradient``, ``dfmp2 gradient``, ``DFMP2(mf).nuc_grad_method()``)
goes through the one stage entry ``dfmp2.drivers.gradient.gradient_stage``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import dfmp2
import dfmp2.drivers.energy
from dfmp2.df import basis as df_basis
from dfmp2.drivers import gradient as gradient_driver
from dfmp2.drivers import job as job_mod
from dfmp2.io import molecule as io_molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.options import RunOptions

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = str(INPUTS / "water.xyz")


@pytest.fixture
def counts(monkeypatch):
    """Calls of prepare, of the cheap checks (RunOptions.check_choices, resolve_reference,
    make_backend), of default_auxbasis(mol, 'jk') wherever a dfmp2 module holds them (by module or
    imported by name), and of the gradient stage."""
    seen = {"prepare": 0, "jk": 0, "stage": 0, "check_choices": 0, "resolve_reference": 0, "make_backend": 0}
    prepare, default_auxbasis, stage = (
        dfmp2.drivers.energy.prepare,
        df_basis.default_auxbasis,
        gradient_driver.gradient_stage,
    )

    def counted_prepare(*a, **k):
        seen["prepare"] += 1
        return prepare(*a, **k)

    check_choices = RunOptions.check_choices

    def counted_check_choices(self):
        seen["check_choices"] += 1
        return check_choices(self)

    monkeypatch.setattr(RunOptions, "check_choices", counted_check_choices)
    for name, fn in (("resolve_reference", io_molecule.resolve_reference), ("make_backend", job_mod.make_backend)):

        def counted(*a, _fn=fn, _name=name, **k):
            seen[_name] += 1
            return _fn(*a, **k)

        for module in [
            m for n, m in list(sys.modules.items()) if n.startswith("dfmp2") and getattr(m, name, None) is fn
        ]:
            monkeypatch.setattr(module, name, counted)

    def counted_auxbasis(mol, kind):
        seen["jk"] += kind == "jk"
        return default_auxbasis(mol, kind)

    def counted_stage(*a, **k):
        seen["stage"] += 1
        return stage(*a, **k)

    for module in [
        m for n, m in list(sys.modules.items()) if n.startswith("dfmp2") and getattr(m, "prepare", None) is prepare
    ]:
        monkeypatch.setattr(module, "prepare", counted_prepare)
    holders = [
        m
        for name, m in list(sys.modules.items())
        if name.startswith("dfmp2") and getattr(m, "default_auxbasis", None) is default_auxbasis
    ]
    assert df_basis in holders
    for module in holders:
        monkeypatch.setattr(module, "default_auxbasis", counted_auxbasis)
    monkeypatch.setattr(gradient_driver, "gradient_stage", counted_stage)
    return seen


@pytest.mark.parametrize("scf_mode", ["df", "pyscf-df"])
def test_a_gradient_run_prepares_once_and_builds_the_jk_set_once(counts, scf_mode):
    gr = dfmp2.gradient(WATER, basis="sto-3g", scf_mode=scf_mode)
    assert gr.gradient.shape == (3, 3)
    assert counts["prepare"] == 1
    assert (counts["check_choices"], counts["resolve_reference"], counts["make_backend"]) == (1, 1, 1), counts
    assert counts["jk"] == 1, counts
    assert counts["stage"] == 1
    job = gr.energy_run.job
    assert job.jk_auxmol is not None and job.jk_auxmol.nao_nr() > job.mol.nao_nr()
    assert gr.parts.ran["reference"] == "rhf"


def test_a_uhf_gradient_run_prepares_once(counts):
    gr = gradient_driver.run_gradient(
        read_xyz(INPUTS / "water.xyz"), RunOptions(basis="sto-3g", charge=1, multiplicity=2)
    )
    assert gr.energy_run.job.unrestricted and gr.parts.ran["reference"] == "uhf"
    assert (counts["prepare"], counts["jk"], counts["stage"]) == (1, 1, 1), counts
    assert (counts["check_choices"], counts["resolve_reference"], counts["make_backend"]) == (1, 1, 1), counts


def test_the_cli_gradient_goes_through_the_one_stage(counts, tmp_path):
    from dfmp2.cli.main import main

    r = CliRunner().invoke(main, ["gradient", WATER, "--basis", "sto-3g", "-q"])
    assert r.exit_code == 0, r.output
    assert (counts["prepare"], counts["jk"], counts["stage"]) == (1, 1, 1), counts


def test_the_pyscf_dropin_gradient_goes_through_the_one_stage(counts):
    from pyscf import gto, scf

    mol = gto.M(atom="O 0 0 0.119; H 0 0.757 -0.477; H 0 -0.757 -0.477", basis="sto-3g", verbose=0)
    mf = scf.RHF(mol).density_fit().run()
    de = dfmp2.DFMP2(mf).nuc_grad_method().kernel()
    assert de.shape == (3, 3) and np.isfinite(de).all()
    assert counts["stage"] == 1 and counts["prepare"] == 0


def test_the_job_carries_the_process_group_and_the_reference_leaves_it_alone(counts):
    from dfmp2 import distributed

    job = dfmp2.drivers.energy.prepare(read_xyz(INPUTS / "water.xyz"), RunOptions(basis="sto-3g"))
    assert isinstance(job.world, distributed.World) and not job.world.distributed
    before = list(job.warnings)
    done = dfmp2.drivers.energy.run_energy(job)
    assert job.warnings == before and done.result.warnings[: len(before)] == before
    assert done.job is job and done.mol is job.mol and counts["prepare"] == 1
