"""Test channels (see ARCHITECTURE.md): default, heavy, slow, cuda, nki_sim, neuron.

The default channel (the README's test command) stays under 5 minutes on two cores; the heavy one
holds the tests of 5 s or more each (several ranks, signals, full disks, scripts' dry runs, the
larger finite-difference cases), each feature keeping a lighter test in the default channel;
.ci/run runs both.

A channel that cannot run here is reported as *skipped* with the reason, never as passed.
"""

import os

# Before torch is imported (libgomp reads it once, when it loads): idle OpenMP threads sleep instead
# of spinning. Under the README's two xdist workers on two cores, each worker's (and each CLI
# subprocess's) two-thread torch and PySCF pools spun on the core the other worker needed: on a
# loaded 2-core machine, tests/mp2/test_pipeline.py, scf/test_dfhf.py and mp2/test_ump2.py on two
# workers took 86 s with spinning, 30 s without. Thread counts and results are unchanged. Inherited by the
# workers and by the subprocesses the tests start; a value already set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch


def pytest_configure(config):
    """Every run the tests start reads the cpu BLAS choice from a fixed table in a cache of the
    tests' own, never the user's (tests/helpers/blas_cache.py says why)."""
    from blas_cache import use_fixed_cache

    use_fixed_cache()


def pytest_addoption(parser):
    parser.addoption(
        "--slow", action="store_true", default=False, help="run the slow channel (full regression set, large shapes)"
    )
    parser.addoption(
        "--heavy", action="store_true", default=False, help="run the heavy channel too (tests of 5 s or more each)"
    )


def _real_nki_available() -> bool:
    """True only for AWS's real nki package with nki.jit and nki.simulate (PyPI's 'nki' is an
    empty placeholder); the same test the trn backend uses to pick its engine."""
    from dfmp2.kernels.nki.engines import real_nki

    return real_nki()[0] is not None


def _neuron_device_available() -> bool:
    from dfmp2.kernels.nki.engines import neuron_devices

    return bool(neuron_devices()) and _real_nki_available()


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the xdist_group marks added here
def pytest_collection_modifyitems(config, items):
    skip = {
        "slow": None if config.getoption("--slow") else "slow channel: run with --slow",
        "heavy": None if config.getoption("--heavy") else "heavy channel (5 s or more each): run with --heavy",
        "cuda": None if torch.cuda.is_available() else "cuda channel: no CUDA GPU on this machine",
        "nki_sim": None
        if _real_nki_available()
        else "nki_sim channel: AWS's nki package (with nki.simulate) is not installed",
        "neuron": None
        if _neuron_device_available()
        else "neuron channel: no Trainium device / Neuron SDK on this machine",
    }
    for item in items:
        for mark, reason in skip.items():
            if reason and mark in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))
    _one_worker_for_the_triton_interpreter(config, items)


def _one_worker_for_the_triton_interpreter(config, items):
    """Under pytest-xdist (README: ``-n 2 --dist loadgroup``) every test of the modules whose
    @interpreted tests share ONE child pytest (tests/helpers/triton_interpreter.py's
    INTERPRETER_MODULES, paths under tests/) goes to the same worker, so the child (~13 s of CPU)
    runs once, not once per worker. Other tests are spread one by one. Nothing changes without
    xdist."""
    if not config.pluginmanager.hasplugin("xdist"):
        return  # the xdist_group mark is xdist's (unknown without it)
    from triton_interpreter import INTERPRETER_MODULES, TESTS

    paths = {TESTS / m for m in INTERPRETER_MODULES}
    for item in items:
        if item.path.resolve() in paths:
            item.add_marker(pytest.mark.xdist_group("triton_interpreter"))


@pytest.fixture(autouse=True)
def _json_documents_validated(monkeypatch):
    """Every result, gradient, optimize, frequencies, interaction and CBS document a test makes
    dfmp2 write (in the test's process) is validated against the shipped JSON Schema first
    (tests/helpers/json_schema.py)."""
    from json_schema import validating_writes

    validating_writes(monkeypatch)


@pytest.fixture
def one_torch_thread():
    """torch's intra-op threads set to 1 for a test module (``pytestmark =
    pytest.mark.usefixtures("one_torch_thread")``): small tests stay fast on a loaded 2-core
    machine (torch's threads fighting over the cores crawl); restored afterwards."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def no_scf(monkeypatch):
    """Refusals must come before the SCF: every SCF entry point (our DF-RHF, PySCF's RHF and
    UHF) fails the test if it is called."""
    from dfmp2.scf import driver, pyscf_scf

    def fail(*a, **k):
        pytest.fail("the SCF must not start")

    monkeypatch.setattr(pyscf_scf, "run_rhf", fail)
    monkeypatch.setattr(pyscf_scf, "run_uhf", fail)
    monkeypatch.setattr(driver, "run_scf", fail)
