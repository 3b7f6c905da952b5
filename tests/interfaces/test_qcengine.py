"""The QCEngine harness: ``import dfmp2.qcengine`` registers program ``dfmp2``;
``qcengine.compute`` then runs QCSchema v1 and v2 AtomicInputs in this process and returns
validated AtomicResults of the input's version whose energies are `dfmp2 run`'s on the same
molecule (which tests/interfaces/test_qcschema.py and tests/system/test_references.py hold against PySCF);
errors are FailedOperations carrying dfmp2's one-line message."""

import json
from functools import cache
from pathlib import Path

import pytest
from click.testing import CliRunner

qcng = pytest.importorskip(
    "qcengine", reason='QCEngine harness: qcengine is not installed (pip install -e ".[qcschema]")'
)
from pyscf.lib.parameters import BOHR
from qcelemental.models import v1, v2

import dfmp2
import dfmp2.qcengine
from dfmp2.cli.main import main
from dfmp2.errors import InputError
from dfmp2.interfaces.qcschema import error_line, run_qcschema

ROOT = Path(__file__).resolve().parents[2]
XYZ = {"water": ROOT / "inputs" / "water.xyz", "hydroxyl": ROOT / "inputs" / "open_shell" / "hydroxyl.xyz"}
MULT = {"water": 1, "hydroxyl": 2}
# Hartree. QCEngine validates an input into qcelemental's Molecule, which rounds the geometry to
# 1e-8 Bohr before the harness sees it (`dfmp2 run` reads the file's digits): up to ~2e-10 Eh
TOL = 1e-9


def atomic_input(name: str, version: int = 1, **keywords) -> dict:
    """The molecule of XYZ[name] as an AtomicInput document (Bohr, PySCF's Bohr radius),
    cc-pVDZ, frozen core; v1's layout or v2's (driver, model, keywords in ``specification``)."""
    lines = XYZ[name].read_text().splitlines()[2:]
    molecule = {
        "symbols": [ln.split()[0] for ln in lines],
        "geometry": [float(x) / BOHR for ln in lines for x in ln.split()[1:]],
        "molecular_charge": 0,
        "molecular_multiplicity": MULT[name],
    }
    spec = {
        "driver": "energy",
        "model": {"method": "mp2", "basis": "cc-pvdz"},
        "keywords": {"frozen_core": True, **keywords},
    }
    if version == 1:
        return {"schema_name": "qcschema_input", "schema_version": 1, "molecule": molecule, **spec}
    return {"schema_name": "qcschema_atomic_input", "schema_version": 2, "molecule": molecule, "specification": spec}


@cache
def cli_energies(name: str) -> dict:
    """`dfmp2 run <xyz> --frozen-core --json`: the energies (Hartree) of the same molecule."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        res = CliRunner().invoke(
            main, ["run", str(XYZ[name]), "--frozen-core", "--multiplicity", str(MULT[name]), "--json", str(out), "-q"]
        )
        assert res.exit_code == 0, res.output
        return json.loads(out.read_text())["energies"]


def test_importing_dfmp2_qcengine_registers_the_program():
    assert "dfmp2" in qcng.list_all_programs()
    harness = qcng.get_program("dfmp2")
    assert harness.found() and harness.get_version() == dfmp2.__version__
    dfmp2.qcengine.register()  # a second registration is harmless
    assert qcng.get_program("dfmp2") is harness


@pytest.mark.parametrize("name, nalpha, nbeta", [("water", 5, 5), ("hydroxyl", 5, 4)])
@pytest.mark.parametrize("version", [1, 2])
def test_compute_returns_a_validated_atomic_result_of_the_inputs_version(name, nalpha, nbeta, version):
    r = qcng.compute(atomic_input(name, version), "dfmp2")
    assert r.success, getattr(r, "error", None)
    model = v1.AtomicResult if version == 1 else v2.AtomicResult
    assert type(r) is model
    text = r.json() if version == 1 else r.model_dump_json()
    r = model.parse_raw(text) if version == 1 else model.model_validate_json(text)  # validates again
    e, p = cli_energies(name), r.properties
    for got, want in [
        (r.return_result, e["e_mp2"]),
        (p.return_energy, e["e_mp2"]),
        (p.scf_total_energy, e["e_hf"]),
        (p.mp2_correlation_energy, e["e_corr"]),
        (p.mp2_same_spin_correlation_energy, e["e_corr_ss"]),
        (p.mp2_opposite_spin_correlation_energy, e["e_corr_os"]),
        (r.extras["qcvars"]["SCS-MP2 TOTAL ENERGY"], e["e_scs_mp2"]),
    ]:
        assert abs(got - want) <= TOL, (got, want)
    assert (p.calcinfo_nalpha, p.calcinfo_nbeta) == (nalpha, nbeta)
    assert p.nuclear_repulsion_energy is not None and p.scf_iterations >= 1
    assert r.provenance.creator == "dfmp2" and r.extras["dfmp2"]["ran"]["device"] == "cpu"


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(
    "driver, changes, kind, fragment",
    [
        ("properties", {"properties": ["octupole"]}, "input_error", "unknown property 'octupole'"),
        ("energy", {"freeze": True}, "input_error", "unknown keyword 'freeze'"),
        ("energy", {"memory_mb": 0.001}, "resource_error", "(keywords.memory_mb)"),
    ],
)
def test_errors_are_failed_operations_with_dfmp2s_line(no_scf, version, driver, changes, kind, fragment):
    doc = atomic_input("water", version, **changes)
    (doc if version == 1 else doc["specification"])["driver"] = driver
    f = qcng.compute(doc, "dfmp2")
    assert not f.success and f.error.error_type == kind
    with pytest.raises(InputError) as e:  # the same run in process: its one line
        run_qcschema(doc)
    line = error_line(e.value)
    assert fragment in line and "\n" not in line and " --" not in line and "input.json" not in line
    assert f.error.error_message.endswith(": " + line), (f.error.error_message, line)
    assert f.error.extras["dfmp2_error"] == type(e.value).__name__
    with pytest.raises(Exception, match="octupole" if driver == "properties" else "keyword"):
        qcng.compute(doc, "dfmp2", raise_error=True)


def test_qcengines_task_memory_is_the_limit(no_scf):
    """task_config memory (GiB) is the run's memory limit on the CPU: far too little is refused
    before the SCF as a resource_error; keywords.memory_mb, when given, wins."""
    f = qcng.compute(atomic_input("water"), "dfmp2", task_config={"memory": 1e-6})
    assert not f.success and f.error.error_type == "resource_error", f.error
    assert "memory" in f.error.error_message
    from qcengine.config import get_config

    from dfmp2.interfaces.qcengine import run_options

    spec = v2.AtomicInput(**atomic_input("water", 2, memory_mb=500.0))
    assert run_options(spec, get_config(task_config={"memory": 2})).memory_mb is None  # the keyword's
    spec = v2.AtomicInput(**atomic_input("water", 2))
    assert run_options(spec, get_config(task_config={"memory": 2})).memory_mb == pytest.approx(2 * 2**30 / 1e6)


def test_qcengines_geometric_procedure_optimises_water_through_dfmp2(tmp_path, monkeypatch):
    """QCEngine's own geomeTRIC procedure, driver 'gradient' on program dfmp2: water from
    OH 1.1 Å, HOH 120° to the DF-MP2/cc-pVDZ minimum; the last gradient (max |g| <= 3e-4 Eh/bohr,
    geomeTRIC's own criteria) and energy are dfmp2.gradient's at the final geometry."""
    pytest.importorskip("geometric", reason="the geomeTRIC procedure needs geomeTRIC (the test extra has it)")
    monkeypatch.chdir(tmp_path)  # geomeTRIC writes its trajectory (qce_optim.xyz) in the working directory
    import numpy as np

    r, th = 1.1 / BOHR, np.radians(120.0)
    geom = [0, 0, 0, r, 0, 0, r * np.cos(th), r * np.sin(th), 0]
    inp = {
        "schema_name": "qcschema_optimization_input",
        "schema_version": 1,
        "keywords": {"program": "dfmp2", "coordsys": "tric", "maxiter": 40},
        "input_specification": {"driver": "gradient", "model": {"method": "mp2", "basis": "cc-pvdz"}},
        "initial_molecule": {"symbols": ["O", "H", "H"], "geometry": geom},
    }
    res = qcng.compute(inp, "geometric", raise_error=True, task_config={"scratch_directory": str(tmp_path)})
    assert res.success and 2 < len(res.trajectory) < 40
    last = np.asarray(res.trajectory[-1].return_result).reshape(3, 3)
    assert np.abs(last).max() <= 3e-4
    from pyscf import gto

    final = np.asarray(res.trajectory[-1].molecule.geometry).reshape(3, 3)  # where that gradient was taken
    mol = gto.M(atom=[("O", final[0]), ("H", final[1]), ("H", final[2])], unit="Bohr", basis="cc-pvdz")
    ours = dfmp2.gradient(mol)
    assert abs(ours.energy - res.energies[-1]) <= 1e-9
    assert np.abs(np.asarray(ours.gradient) - last).max() <= 1e-8


def _psi4_harness_fields() -> str:
    """The source of QCEngine's own Psi4 harness: the fields it fills that ours must fill too."""
    import inspect

    from qcengine.programs import psi4

    return inspect.getsource(psi4)


def test_the_fields_qcengines_psi4_harness_fills_are_filled():
    """Water, energy and gradient, compared field by field with what QCEngine's Psi4 harness sets
    (stdout, native_files['input'], provenance memory and nthreads, scf_total_gradient and the
    gradient qcvars; the names are read from its source, so a rename there fails here)."""
    src = _psi4_harness_fields()
    for name in ('["memory"]', '["nthreads"]', '"native_files"', '"input"', '"stdout"'):
        assert name in src, name
    for driver in ("energy", "gradient"):
        doc = atomic_input("water", 2)
        doc["specification"]["driver"] = driver
        doc["specification"]["protocols"] = {"native_files": "all"}
        r = qcng.compute(doc, "dfmp2", task_config={"ncores": 1, "memory": 1.5})
        assert r.success, r.error
        assert "E(MP2)" in r.stdout and "E(HF)" in r.stdout
        assert json.loads(r.native_files["input"])["molecule"]["symbols"] == ["O", "H", "H"]
        assert r.provenance.memory == pytest.approx(1.5, abs=1e-3) and r.provenance.nthreads == 1
        if driver == "gradient":
            grad = r.return_result
            assert r.properties.scf_total_gradient is not None
            q = r.extras["qcvars"]
            assert q["CURRENT GRADIENT"] == grad.tolist()
            assert q["MP2 TOTAL GRADIENT"] == q["CURRENT GRADIENT"]
            assert q["SCF TOTAL GRADIENT"] == r.properties.scf_total_gradient.tolist()
            assert "nuclear gradient" in r.stdout


@pytest.mark.parametrize("method, key", [("scs-mp2", "e_scs_mp2"), ("sos-mp2", "e_sos_mp2")])
def test_scaled_methods_through_qcengine_equal_the_cli(method, key):
    doc = atomic_input("water", 2)
    doc["specification"]["model"]["method"] = method
    r = qcng.compute(doc, "dfmp2")
    assert r.success, r.error
    assert abs(r.return_result - cli_energies("water")[key]) <= TOL
    assert r.extras["qcvars"]["CURRENT ENERGY"] == r.return_result


def test_a_wavefunction_protocol_is_refused_in_one_line():
    doc = atomic_input("water", 2)
    doc["specification"]["protocols"] = {"wavefunction": "orbitals_and_eigenvalues"}
    f = qcng.compute(doc, "dfmp2")
    assert not f.success and f.error.error_type == "input_error"
    assert "protocols.wavefunction" in f.error.error_message and "\n" not in f.error.error_message.split(": ", 1)[1]
