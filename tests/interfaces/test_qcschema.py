"""QCSchema in and out: an AtomicInput for water round-trips to an AtomicResult that
qcelemental validates, with the energies of `dfmp2 run water.xyz` (and PySCF's reference);
errors on this path are one error line and a FailedOperation with the same message."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

qcel = pytest.importorskip(
    "qcelemental", reason='QCSchema path: qcelemental is not installed (pip install -e ".[qcschema]")'
)
from pyscf.lib.parameters import BOHR
from qcelemental.models import AtomicResult, FailedOperation

from dfmp2.cli.main import main
from dfmp2.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
WATER_XYZ = ROOT / "inputs" / "water.xyz"


def water_input(**changes) -> dict:
    """water.xyz as an AtomicInput: the same coordinates in Bohr (PySCF's Bohr radius)."""
    lines = WATER_XYZ.read_text().splitlines()[2:]
    doc = {
        "schema_name": "qcschema_input",
        "schema_version": 1,
        "driver": "energy",
        "model": {"method": "mp2", "basis": "cc-pvdz"},
        "keywords": {"frozen_core": True},
        "molecule": {
            "symbols": [ln.split()[0] for ln in lines],
            "geometry": [float(x) / BOHR for ln in lines for x in ln.split()[1:]],
            "molecular_charge": 0,
            "molecular_multiplicity": 1,
        },
    }
    for key, value in changes.items():
        doc[key] = value
    return doc


def as_v2(doc: dict) -> dict:
    """A v1 AtomicInput document in QCSchema v2's layout (driver, model and keywords in
    ``specification``), written out by hand rather than by the code under test."""
    spec = {k: doc[k] for k in ("driver", "model", "keywords") if k in doc}
    return {
        "schema_name": "qcschema_atomic_input",
        "schema_version": 2,
        "molecule": doc["molecule"],
        "specification": spec,
    }


def hydroxyl_input(**changes) -> dict:
    """inputs/open_shell/hydroxyl.xyz (OH radical, doublet) as an AtomicInput, cc-pVDZ, frozen core."""
    lines = (ROOT / "inputs" / "open_shell" / "hydroxyl.xyz").read_text().splitlines()[2:]
    doc = water_input(**changes)
    doc["molecule"] = {
        "symbols": [ln.split()[0] for ln in lines],
        "geometry": [float(x) / BOHR for ln in lines for x in ln.split()[1:]],
        "molecular_charge": 0,
        "molecular_multiplicity": 2,
    }
    return doc


def write(tmp_path, doc, name="in.json") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(p)


def test_open_shell_atomic_input_runs_dfump2(tmp_path):
    """H2O+ (doublet) as an AtomicInput: DF-UMP2 on UHF, a valid AtomicResult whose energies are
    `dfmp2 run`'s on the same molecule, and the UHF spin record in extras."""
    doc = dict(
        water_input(), molecule={**water_input()["molecule"], "molecular_charge": 1, "molecular_multiplicity": 2}
    )
    out, ours = tmp_path / "out.json", tmp_path / "ours.json"
    res = CliRunner().invoke(main, ["run", write(tmp_path, doc), "--qcschema", str(out), "-q"])
    assert res.exit_code == 0, res.output
    r = AtomicResult.parse_file(out)
    assert r.success and r.extras["dfmp2"]["spin"]["reference"] == "UHF"
    res = CliRunner().invoke(
        main,
        ["run", str(WATER_XYZ), "--frozen-core", "--charge", "1", "--multiplicity", "2", "--json", str(ours), "-q"],
    )
    assert res.exit_code == 0, res.output
    plain = json.loads(ours.read_text())["energies"]
    assert abs(r.properties.mp2_total_energy - plain["e_mp2"]) <= 1e-10
    assert abs(r.properties.scf_total_energy - plain["e_hf"]) <= 1e-10


def one_error_line(res) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output)
    assert "Traceback" not in res.output and res.exc_info[0] is SystemExit
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0][len("error: ") :]


def test_water_atomic_input_round_trips_to_a_valid_atomic_result(tmp_path):
    out, ours, plain = tmp_path / "out.json", tmp_path / "ours.json", tmp_path / "plain.json"
    res = CliRunner().invoke(
        main, ["run", write(tmp_path, water_input()), "--qcschema", str(out), "--json", str(ours), "-q"]
    )
    assert res.exit_code == 0, res.output
    r = AtomicResult.parse_file(out)  # qcelemental validates it
    assert r.success and r.driver == "energy" and r.model.method == "mp2" and r.model.basis == "cc-pvdz"
    assert r.provenance.creator == "dfmp2" and r.extras["dfmp2"]["ran"]["device"] == "cpu"
    res = CliRunner().invoke(main, ["run", str(WATER_XYZ), "--frozen-core", "--json", str(plain), "-q"])
    assert res.exit_code == 0, res.output
    e = json.loads(plain.read_text())["energies"]
    p = r.properties
    pairs = [
        (r.return_result, e["e_mp2"]),
        (p.return_energy, e["e_mp2"]),
        (p.mp2_total_energy, e["e_mp2"]),
        (p.scf_total_energy, e["e_hf"]),
        (p.mp2_correlation_energy, e["e_corr"]),
        (p.mp2_doubles_energy, e["e_corr"]),
        (p.mp2_same_spin_correlation_energy, e["e_corr_ss"]),
        (p.mp2_opposite_spin_correlation_energy, e["e_corr_os"]),
        (r.extras["qcvars"]["SCS-MP2 TOTAL ENERGY"], e["e_scs_mp2"]),
        (r.extras["qcvars"]["SOS-MP2 CORRELATION ENERGY"], e["e_corr_sos"]),
    ]
    for got, want in pairs:
        assert abs(got - want) <= 1e-11, (got, want)
    assert p.mp2_singles_energy == 0.0 and p.calcinfo_nbasis == 24 and p.calcinfo_nalpha == 5
    assert json.loads(ours.read_text())["energies"] == e  # --json of both runs agree
    ref = json.loads((ROOT / "inputs" / "references.json").read_text())["references"]["water|cc-pvdz|cc-pvdz-ri|df|fc"]
    assert abs(p.mp2_correlation_energy - ref["e_corr"]) <= 1e-9  # and PySCF


def test_xyz_input_with_qcschema_output(tmp_path):
    out = tmp_path / "out.json"
    res = CliRunner().invoke(main, ["run", str(WATER_XYZ), "--basis", "sto-3g", "--qcschema", str(out), "-q"])
    assert res.exit_code == 0, res.output
    r = AtomicResult.parse_file(out)
    lines = WATER_XYZ.read_text().splitlines()[2:]
    angstrom = np.array([[float(x) for x in ln.split()[1:]] for ln in lines])
    assert np.allclose(r.molecule.geometry * BOHR, angstrom, atol=1e-8)  # written in Bohr
    assert r.model.basis == "sto-3g" and r.keywords["frozen_core"] is False
    assert r.properties.mp2_correlation_energy < -1e-3


@pytest.mark.parametrize(
    "doc, args, fragment",
    [
        ("{not json", [], "not valid JSON"),
        ("[1, 2]", [], "is a JSON object"),
        (water_input(driver="hessian", keywords={"mp2_type": "conv"}), [], "density-fitted MP2 only"),
        (
            water_input(schema_version=3),
            [],
            "schema_version 3 is not supported; dfmp2 reads QCSchema AtomicInput v1 and v2",
        ),
        (water_input(driver="nonsense"), [], "not a valid QCSchema AtomicInput: driver"),
        (
            water_input(driver="properties", model={"method": "mp2", "basis": "sto-3g", "properties": ["quadrupole"]}),
            [],
            'model.properties ["quadrupole"] is not supported; dfmp2 computes dipole',
        ),
        (water_input(keywords={"frozen_core": True, "freeze_core": False}), [], "set the same thing (frozen_core)"),
        (water_input(model={"method": "ccsd", "basis": "cc-pvdz"}), [], "model.method 'ccsd' is not supported"),
        (water_input(keywords={"freeze": True}), [], "unknown keyword 'freeze'"),
        (water_input(keywords={"frozen_core": "yes"}), [], "keyword frozen_core must be true or false"),
        (water_input(keywords={"precision": "fp16"}), [], "keyword precision must be 'fp64' or 'fp32'"),
        (
            water_input(),
            ["--basis", "sto-3g"],
            "already sets basis (model.basis); give it in the input or as an option, not both (--basis)",
        ),
        (water_input(), ["--frozen-core"], "already sets frozen_core (keywords.frozen_core)"),
        # B2PLYP ran and the AtomicResult said scs-mp2; b2plyp twice was a KeyError's traceback
        (
            water_input(model={"method": "scs-mp2", "basis": "sto-3g"}),
            ["--method", "b2plyp"],
            "already sets method (model.method); give it in the input or as an option, not both (--method)",
        ),
        (water_input(model={"method": "b2plyp", "basis": "sto-3g"}), ["--method", "b2plyp"], "already sets method"),
        (water_input(model={"method": "mp2", "basis": "no-such-basis"}), [], "basis 'no-such-basis' is not defined"),
        (
            dict(
                water_input(),
                molecule={**water_input()["molecule"], "molecular_charge": 1, "molecular_multiplicity": 1},
            ),
            [],
            "Inconsistent or unspecified chg/mult",
        ),
    ],
)
def test_errors_are_one_line_and_a_failed_operation(tmp_path, no_scf, doc, args, fragment):
    out = tmp_path / "out.json"
    res = CliRunner().invoke(main, ["run", write(tmp_path, doc), "--qcschema", str(out), *args])
    message = one_error_line(res)
    assert fragment in message, message
    f = FailedOperation.parse_file(out)  # qcelemental validates it
    assert not f.success and f.error.error_message == message
    assert f.error.error_type == "input_error"
    if not isinstance(doc, str):
        assert f.input_data == doc  # the input as given


def test_the_inputs_method_wins_over_the_options_given_in_python():
    """run_qcschema(inp, options): options carry what QCSchema does not; an options.method of
    b2plyp beside model.method scs-mp2 ran B2PLYP under the scs-mp2 label. The input's method is
    the run's: MP2 (RunOptions.method 'mp2', SCS from its parts) or its double hybrid."""
    from dfmp2.interfaces import qcschema
    from dfmp2.options import RunOptions

    for method, runs in (("scs-mp2", "mp2"), ("sos-mp2", "mp2"), ("mp2", "mp2"), ("b2plyp", "b2plyp")):
        doc = water_input(model={"method": method, "basis": "sto-3g"})
        options = qcschema.parse_input(doc, "in.json", RunOptions(method="dsd-blyp"))[3]
        assert options.method == runs, method


@pytest.mark.parametrize("make", [water_input, hydroxyl_input], ids=["rhf", "uhf"])
def test_driver_gradient_through_dfmp2_run_prints_and_writes_the_gradient(tmp_path, make):
    """``dfmp2 run input.json`` with driver 'gradient' computed the gradient and then
    neither printed it nor wrote it to --json. Now as ``dfmp2 gradient``: the table and the JSON's
    'gradient' section, the same numbers as the AtomicResult's return_result."""
    doc = make(driver="gradient", model={"method": "mp2", "basis": "sto-3g"})
    out, qc = tmp_path / "out.json", tmp_path / "qc.json"
    res = CliRunner().invoke(main, ["run", write(tmp_path, doc), "--json", str(out), "--qcschema", str(qc), "-q"])
    assert res.exit_code == 0, res.output
    assert "nuclear gradient of E(MP2) / (Eh/bohr)" in res.output
    d = json.loads(out.read_text())
    g = np.array(d["gradient"]["gradient"])
    assert g.shape == (len(doc["molecule"]["symbols"]), 3) and d["units"]["gradient"] == "hartree/bohr"
    assert d["gradient"]["method"] == "mp2" and d["gradient"]["energy"] == d["energies"]["e_mp2"]
    r = AtomicResult.parse_file(qc)
    assert np.array_equal(np.asarray(r.return_result).reshape(-1, 3), g)
    assert f"{g[0, 2]:+.10f}" in res.output


def test_an_unwritable_qcschema_path_is_refused_before_the_run(tmp_path, no_scf):
    res = CliRunner().invoke(main, ["run", str(WATER_XYZ), "--qcschema", str(tmp_path / "nodir" / "out.json")])
    assert "--qcschema" in one_error_line(res)


def test_missing_qcelemental_is_one_line_naming_the_install(tmp_path, no_scf, monkeypatch):
    monkeypatch.setitem(sys.modules, "qcelemental", None)  # import qcelemental -> ImportError
    for args in (
        ["run", write(tmp_path, water_input())],
        ["run", str(WATER_XYZ), "--qcschema", str(tmp_path / "o.json")],
    ):
        message = one_error_line(CliRunner().invoke(main, args))
        assert "qcelemental" in message and 'pip install -e ".[qcschema]"' in message
    assert not (tmp_path / "o.json").exists()


# --- fuzz: every document is a result or one line + a FailedOperation, never a traceback -------
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

JSON_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "mp2", "cc-pvdz", "fp32", "auto", "none", "df", "cuda", "x" * 80]),
    st.lists(st.integers(-1, 1), max_size=3),
)
DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "driver": st.sampled_from(["energy", "gradient", "Energy", "", None, 3]),
        "model": st.one_of(
            JSON_VALUE,
            st.fixed_dictionaries(
                {
                    "method": st.sampled_from(["mp2", "MP2", "hf", "", None]),
                    "basis": st.sampled_from(["cc-pvdz", "sto-3g", "def2-svp", "no-such", "", None, 5]),
                }
            ),
        ),
        "keywords": st.dictionaries(
            st.sampled_from(
                ["auxbasis", "frozen_core", "ecp", "scf_mode", "device", "precision", "memory_mb", "freeze_core", ""]
            ),
            JSON_VALUE,
            max_size=3,
        ),
        "molecule": st.fixed_dictionaries(
            {},
            optional={
                "symbols": st.lists(st.sampled_from(["O", "H", "I", "Xx", "h", "", "Gh"]), min_size=0, max_size=4),
                "geometry": st.lists(
                    st.one_of(st.floats(-5, 5), st.floats(allow_nan=True, allow_infinity=True), st.just("a")),
                    max_size=10,
                ),
                "molecular_charge": JSON_VALUE,
                "molecular_multiplicity": JSON_VALUE,
                "real": st.lists(st.booleans(), max_size=4),
            },
        ),
        "schema_name": st.sampled_from(["qcschema_input", "qcschema_output", "x"]),
        "extra_field": JSON_VALUE,
    },
)


@settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(changes=DOCUMENTS)
def test_fuzzed_atomic_inputs_fail_cleanly(tmp_path, changes):
    """Mutations of the water input; --memory far below need stops a valid one before the SCF."""
    doc = water_input()
    for key, value in changes.items():
        doc[key] = {**doc["molecule"], **value} if key == "molecule" else value
    path, out = write(tmp_path, json.dumps(doc, allow_nan=True)), tmp_path / "out.json"
    out.unlink(missing_ok=True)
    res = CliRunner().invoke(main, ["run", path, "--memory", "0.001MB", "--qcschema", str(out), "-q"])
    message = one_error_line(res)
    assert "Warning" not in res.output
    f = FailedOperation.parse_file(out)
    assert not f.success and f.error.error_message == message


def test_scf_mode_keyword_takes_every_scf_mode(tmp_path):
    """The scf_mode keyword lacked pyscf-df: it takes dfmp2.options.SCF_MODES."""
    out = tmp_path / "out.json"
    doc = water_input(keywords={"frozen_core": True, "scf_mode": "pyscf-df"})
    res = CliRunner().invoke(main, ["run", write(tmp_path, doc), "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["scf_mode"] == "pyscf-df" and d["ran"]["scf"]["engine"] == "pyscf"


# --- QCSchema v2, the SCF's parts, open-shell counts, ghost atoms, in process ---------
def plain_run(tmp_path, xyz, *args) -> dict:
    """`dfmp2 run <xyz> --frozen-core <args> --json`: its energies (Hartree)."""
    out = tmp_path / "plain.json"
    res = CliRunner().invoke(main, ["run", str(xyz), "--frozen-core", *args, "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())["energies"]


def test_a_v2_atomic_input_file_runs_and_writes_a_v2_atomic_result(tmp_path):
    """`dfmp2 run` reads QCSchema v2 (what QCEngine >= 0.50 hands out) and answers in v2."""
    out = tmp_path / "out.json"
    res = CliRunner().invoke(main, ["run", write(tmp_path, as_v2(water_input())), "--qcschema", str(out), "-q"])
    assert res.exit_code == 0, res.output
    r = qcel.models.v2.AtomicResult.model_validate_json(out.read_text())  # qcelemental validates it
    assert r.schema_version == 2 and r.input_data.specification.driver == "energy"
    e = plain_run(tmp_path, WATER_XYZ)
    assert abs(r.return_result - e["e_mp2"]) <= 1e-10
    assert abs(r.properties.scf_total_energy - e["e_hf"]) <= 1e-10


def test_a_v2_input_error_is_a_v2_failed_operation(tmp_path, no_scf):
    out = tmp_path / "out.json"
    doc = as_v2(water_input(driver="hessian", keywords={"mp2_type": "conv"}))
    message = one_error_line(CliRunner().invoke(main, ["run", write(tmp_path, doc), "--qcschema", str(out)]))
    assert 'keyword mp2_type "conv" is not supported' in message
    f = qcel.models.v2.FailedOperation.model_validate_json(out.read_text())
    assert f.error.error_message == message and f.input_data == doc


def pyscf_df_scf(doc: dict, ghost=()):
    """PySCF's own DF-SCF (cc-pVDZ-JKFIT) of an AtomicInput's molecule (Bohr), the atoms in
    ``ghost`` as PySCF 'ghost-' atoms: (mol, converged mf)."""
    from pyscf import gto
    from pyscf import scf as pyscf_scf

    m = doc["molecule"]
    xyz = np.reshape(m["geometry"], (-1, 3))
    atoms = [(("ghost-" if i in ghost else "") + s, tuple(c)) for i, (s, c) in enumerate(zip(m["symbols"], xyz))]
    mol = gto.M(
        atom=atoms,
        basis="cc-pvdz",
        unit="Bohr",
        charge=m["molecular_charge"],
        spin=m["molecular_multiplicity"] - 1,
        verbose=0,
    )
    mf = (pyscf_scf.UHF(mol) if mol.spin else pyscf_scf.RHF(mol)).density_fit(auxbasis="cc-pvdz-jkfit")
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-9
    mf.kernel()
    assert mf.converged
    return mol, mf


@pytest.mark.parametrize("name, nalpha, nbeta", [("water", 5, 5), ("hydroxyl", 5, 4)])
def test_scf_parts_and_electron_counts_against_pyscf(name, nalpha, nbeta):
    """In process (run_qcschema): the alpha and beta electron counts (OH: 5 and 4), E_nuc as
    PySCF's energy_nuc, E_1 as PySCF's DF-SCF's one-electron energy, E_nuc + E_1 + E_2 = E_HF,
    the SCF's iteration count."""
    from dfmp2.interfaces.qcschema import run_qcschema

    doc = water_input() if name == "water" else hydroxyl_input()
    p = run_qcschema(doc).properties
    assert (p.calcinfo_nalpha, p.calcinfo_nbeta) == (nalpha, nbeta)
    mol, mf = pyscf_df_scf(doc)
    assert abs(p.nuclear_repulsion_energy - mol.energy_nuc()) <= 1e-10
    assert abs(p.scf_one_electron_energy - mf.scf_summary["e1"]) <= 1e-6
    assert abs(p.scf_total_energy - mf.e_tot) <= 1e-8
    parts = p.nuclear_repulsion_energy + p.scf_one_electron_energy + p.scf_two_electron_energy
    assert abs(parts - p.scf_total_energy) <= 1e-10
    assert isinstance(p.scf_iterations, int) and 1 <= p.scf_iterations <= 100


def test_ghost_atoms_run_and_match_pyscf():
    """Water with a ghost water's basis functions (``real`` false): E(HF) and E(MP2) as PySCF's own
    DF-RHF and DF-MP2 with PySCF's 'ghost-' atoms; the ghosts add no nuclear repulsion."""
    from pyscf import df
    from pyscf.mp.dfmp2 import DFMP2

    from dfmp2.interfaces.qcschema import run_qcschema

    dimer = [
        ln.split()
        for ln in (ROOT / "inputs" / "s22" / "s22_02_water_dimer.xyz").read_text().splitlines()[2:]
        if len(ln.split()) == 4
    ]
    doc = water_input(keywords={})
    doc["molecule"] = {
        "symbols": [a[0] for a in dimer],
        "geometry": [float(x) / BOHR for a in dimer for x in a[1:]],
        "real": [True] * 3 + [False] * 3,
        "molecular_charge": 0,
        "molecular_multiplicity": 1,
    }
    r = run_qcschema(doc)
    mol, mf = pyscf_df_scf(doc, ghost={3, 4, 5})
    pt = DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    pt.kernel()
    assert mol.nao_nr() == r.properties.calcinfo_nbasis == 48  # the dimer's basis
    assert abs(r.properties.scf_total_energy - mf.e_tot) <= 1e-8
    assert abs(r.properties.mp2_correlation_energy - pt.e_corr) <= 1e-8
    assert abs(r.properties.nuclear_repulsion_energy - mol.energy_nuc()) <= 1e-10
    assert r.extras["dfmp2"]["formula"] == "H2O + 3 ghost atoms"


def test_run_qcschema_takes_models_of_both_versions_and_answers_in_kind():
    from qcelemental.models import v1, v2

    from dfmp2.interfaces.qcschema import run_qcschema

    doc = water_input(model={"method": "mp2", "basis": "sto-3g"})
    r1 = run_qcschema(v1.AtomicInput(**doc))
    r2 = run_qcschema(v2.AtomicInput(**as_v2(doc)))
    assert isinstance(r1, v1.AtomicResult) and isinstance(r2, v2.AtomicResult)
    assert r1.return_result == pytest.approx(r2.return_result, abs=1e-10)
    with pytest.raises(InputError, match="expected a QCSchema AtomicInput"):
        run_qcschema("water.json")


def test_library_errors_name_the_atomic_input_field_not_a_cli_flag(no_scf):
    from dfmp2.errors import MemoryLimitError
    from dfmp2.interfaces.qcschema import error_line, run_qcschema

    with pytest.raises(MemoryLimitError) as e:
        run_qcschema(water_input(keywords={"memory_mb": 0.001}))
    line = error_line(e.value)
    assert line.endswith("(keywords.memory_mb)") and "--" not in line and "\n" not in line
    with pytest.raises(InputError) as e:
        run_qcschema(water_input(model={"method": "mp2", "basis": "no-such-basis"}))
    assert "(model.basis)" in error_line(e.value) and "--basis" not in error_line(e.value)
