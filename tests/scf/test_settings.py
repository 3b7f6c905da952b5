"""SCFSettings: the SCF's settings from the run options in one place, with run_scf's defaults."""

import dataclasses

import pytest

from dfmp2.options import SCF_CONV_TOL, SCF_CONV_TOL_GRAD, SCF_MAX_CYCLE, SCF_SCREEN, RunOptions
from dfmp2.scf.jk import JK_BLOCK_MB
from dfmp2.scf.settings import DEFAULT_SETTINGS, PLAN_FIELDS, ScfPlan, SCFSettings


def test_defaults_are_a_bare_run_scfs():
    s = SCFSettings()
    assert s == DEFAULT_SETTINGS
    assert (s.max_cycle, s.conv_tol, s.conv_tol_grad) == (SCF_MAX_CYCLE, SCF_CONV_TOL, SCF_CONV_TOL_GRAD)
    assert (s.precision, s.fp32_copy, s.fp32_speedup, s.incremental) == ("auto", True, None, None)
    assert (s.layout, s.block_mb, s.fit_mb, s.screen) == ("packed", JK_BLOCK_MB, None, SCF_SCREEN)
    assert (s.unrestricted, s.stability, s.scratch_dir) == (False, False, None)


def test_from_options_takes_the_options_and_the_plans_share(tmp_path):
    options = RunOptions(
        scf_max_cycle=7,
        scf_conv_tol_grad=1e-7,
        scf_precision="fp64",
        scf_screen=0.0,
        scf_stability=False,
        scratch_dir=str(tmp_path),
    )
    plan = ScfPlan(block_mb=1.0, fp32_copy=False, layout="disk", disk=3.0, fit_mb=2.0, fp32_speedup=1.7)
    s = SCFSettings.from_options(options, unrestricted=True, plan=plan)
    assert (s.max_cycle, s.conv_tol, s.conv_tol_grad) == (7, SCF_CONV_TOL, 1e-7)
    assert (s.precision, s.screen, s.stability, s.scratch_dir) == ("fp64", 0.0, False, str(tmp_path))
    assert s.unrestricted
    assert {k: getattr(s, k) for k in PLAN_FIELDS} == {k: getattr(plan, k) for k in PLAN_FIELDS}
    bare = SCFSettings.from_options(RunOptions())
    assert bare.stability is RunOptions().scf_stability and bare.layout == "packed"


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_SETTINGS.max_cycle = 3
    assert DEFAULT_SETTINGS.replace(max_cycle=3).max_cycle == 3 and DEFAULT_SETTINGS.max_cycle == SCF_MAX_CYCLE
