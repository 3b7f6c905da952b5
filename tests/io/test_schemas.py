"""The published JSON Schemas (dfmp2/io/schemas): shipped in the package, strict enough
that a missing or renamed key fails, in step with the typed records they describe, and met by RHF
and UHF documents with the same keys (null where a field does not apply). Every document a test
makes dfmp2 write in-process is validated too (tests/conftest.py, tests/helpers/json_schema.py)."""

import copy
import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import tomllib
from click.testing import CliRunner
from json_schema import checked, key_paths, read

from dfmp2.cli.main import main
from dfmp2.io import schemas
from dfmp2.io.result import SCHEMA_VERSION, Result
from dfmp2.memory import MemoryPlan
from dfmp2.provenance import ScfRecord, StorageRecord
from dfmp2.scf.stability import StabilityRecord

ROOT = Path(__file__).resolve().parents[2]
WATER = "3\nwater\nO 0.000 0.000 0.117\nH 0.000 0.757 -0.467\nH 0.000 -0.757 -0.467\n"
OH = "2\nhydroxyl radical\nO 0.0 0.0 0.0\nH 0.0 0.0 0.97\n"
ARGS = ["--basis", "sto-3g", "--cpu-blas", "torch", "-q"]


@pytest.fixture(scope="module")
def documents(tmp_path_factory):
    """{(command, 'rhf'|'uhf'): the --json document} of water and OH, energy and gradient."""
    tmp = tmp_path_factory.mktemp("docs")
    docs = {}
    for ref, xyz in (("rhf", WATER), ("uhf", OH)):
        (tmp / f"{ref}.xyz").write_text(xyz)
        for command in ("run", "gradient"):
            out = tmp / f"{command}-{ref}.json"
            r = CliRunner().invoke(main, [command, str(tmp / f"{ref}.xyz"), *ARGS, "--json", str(out)])
            assert r.exit_code == 0, r.output
            docs[command, ref] = read(out)
    return docs


def test_every_schema_is_shipped_and_a_valid_2020_12_schema():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "*.json" in data["dfmp2.io.schemas"]
    for name in (*schemas.NAMES, "common"):
        s = schemas.load(name)
        jsonschema.Draft202012Validator.check_schema(s)
        assert s["$id"] == schemas.URN + name
    assert schemas.load("common")["$defs"]["schema_version"]["const"] == SCHEMA_VERSION


@pytest.mark.parametrize("command", ["run", "gradient"])
def test_rhf_and_uhf_documents_have_the_same_keys(documents, command):
    """A UHF result had ran.scf.stability and an RHF one no such key; now null for RHF.
    The gradient's plan and Z-vector form are recorded for both (the UHF stage has a
    plan too). Stage maps (timings, flops) hold the stages that ran and are not compared."""
    rhf, uhf = documents[command, "rhf"], documents[command, "uhf"]
    assert rhf["ran"]["scf"]["stability"] is None and uhf["ran"]["scf"]["stability"] is not None
    assert rhf["spin"] is None and uhf["spin"] is not None
    assert set(rhf) == set(uhf)
    only = key_paths(rhf) ^ key_paths(uhf)
    nulls = ("/spin/", "/ran/scf/stability/")  # an object on one side, null on the other
    assert all(p.startswith(nulls) for p in only), sorted(only)
    if command == "gradient":
        assert uhf["gradient"]["ran"]["plan"]["zvector"] == "ao" and uhf["gradient"]["zvector"]["form"] == "ao"
        assert set(rhf["gradient"]["ran"]) == set(uhf["gradient"]["ran"])


def _fails(doc, name):
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate(doc, name)


@pytest.mark.parametrize(
    "path",
    [("energies", "e_mp2"), ("ran", "scf", "stability"), ("ran", "storage", "B"), ("memory", "peak_mb"), ("spin",)],
)
def test_a_missing_or_renamed_key_fails(documents, path):
    for kind, ref in (("run", "rhf"), ("gradient", "uhf")):
        name = "result" if kind == "run" else "gradient"
        doc = documents[kind, ref]
        schemas.validate(doc, name)
        gone = copy.deepcopy(doc)
        parent = gone
        for k in path[:-1]:
            parent = parent[k]
        value = parent.pop(path[-1])
        _fails(gone, name)
        parent[path[-1] + "_renamed"] = value
        _fails(gone, name)
    wrong = copy.deepcopy(documents["run", "rhf"])
    wrong["energies"]["e_mp2"] = "-76.2"  # a type
    _fails(wrong, "result")
    _fails(documents["run", "rhf"], "gradient")  # a result is not a gradient document
    extra = dict(documents["gradient", "rhf"], optimization={})
    _fails(extra, "gradient")


def test_schemas_follow_the_typed_records():
    """A field added to (or removed from) a record must be added to its schema: the one place
    each record is defined (common.schema.json's $defs)."""
    defs = schemas.load("common")["$defs"]

    def props(name):
        return set(defs[name]["properties"])

    names = {f.name for f in dataclasses.fields(ScfRecord)}
    assert props("scf_record") == names and set(defs["scf_record"]["required"]) == names
    assert props("storage") == {f.name for f in dataclasses.fields(StorageRecord)}
    assert props("memory") == {f.name for f in dataclasses.fields(MemoryPlan)}
    assert props("stability") == {f.name for f in dataclasses.fields(StabilityRecord)}
    moved = {"e_scf", "e_os", "e_ss", "nbasis", "nmo", "nocc", "nfrozen", "nvir", "naux"}  # to energies, shapes
    fields = {f.name for f in dataclasses.fields(Result)} - moved
    assert props("result_body") == fields | {"schema_version", "energies", "units", "shapes"}
    assert set(defs["result_body"]["required"]) == props("result_body")
    assert props("shapes") == moved - {"e_scf", "e_os", "e_ss"}


def test_checked_names_the_failing_path(documents):
    doc = copy.deepcopy(documents["run", "uhf"])
    doc["ran"]["scf"].pop("guess")
    with pytest.raises(AssertionError, match="ran/scf: 'guess' is a required property"):
        checked(doc)
    assert json.loads(json.dumps(checked(documents["run", "uhf"]))) == documents["run", "uhf"]
