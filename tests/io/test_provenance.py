"""What ran, as the result says it: typed records with the same keys and types for RHF and UHF,
a schema version, and a checkpoint record that says where the SCF came from."""

import json
from pathlib import Path

import pytest

from dfmp2.interfaces.api import run
from dfmp2.io.result import SCHEMA_VERSION
from dfmp2.options import RunOptions

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
WATER = INPUTS / "water.xyz"
OH = INPUTS / "open_shell" / "hydroxyl.xyz"
# {name: value} maps whose keys vary by run (stages, kernels), and the SCF engine's own records
# of its JK factor and integral engine (a dict for our DF-SCF, None for PySCF's), a UHF's stability
# check (a dict; None for RHF and where it was turned off)
MAPS = {
    "timings",
    "flops",
    "peak_rss_mb",
    "ran.kernels",
    "ran.scf.kernels",
    "ran.scf.host_kernels",
    "ran.scf.times",
    "memory.stages_mb",
    "memory.shapes",
    "memory.integrals",
    "ran.scf.jk_factor",
    "ran.scf.integrals",
    "ran.scf.stability",
}


def _shape(d, path="", ignore_none=False):
    """{dotted key: type name} of a JSON document, maps' values typed as a whole."""
    out = {}
    for k, v in d.items():
        key = f"{path}{k}"
        if isinstance(v, dict) and key not in MAPS:
            out.update(_shape(v, key + ".", ignore_none))
        elif not (ignore_none and v is None):
            out[key] = "map" if key in MAPS else type(v).__name__
    return out


def _json(path, **options):
    return json.loads(json.dumps(run(path, RunOptions(**options)).to_dict()))


# the top-level keys of the result JSON (schema 5), as docs/cli-and-json.md's table lists them
TOP_LEVEL = {
    "schema_version",
    "molecule",
    "natm",
    "formula",
    "charge",
    "multiplicity",
    "geometry",
    "basis",
    "auxbasis",
    "scf_mode",
    "jk_auxbasis",
    "frozen_core",
    "timings",
    "flops",
    "peak_rss_mb",
    "wall_s",
    "ran",
    "memory",
    "versions",
    "warnings",
    "ecp",
    "date",
    "spin",
    "energies",
    "units",
    "shapes",
    "properties",
    "double_hybrid",  # schema 6: null unless --method names a double hybrid
    "profile",  # schema 12: null unless dfmp2 run --profile
}


def _dotted_keys(d, path=""):
    """Every key holding a '.' at any depth (lists walked too)."""
    if isinstance(d, dict):
        return [f"{path}/{k}" for k in d if "." in k] + [
            x for k, v in d.items() for x in _dotted_keys(v, f"{path}/{k}")
        ]
    if isinstance(d, list):
        return [x for i, v in enumerate(d) for x in _dotted_keys(v, f"{path}[{i}]")]
    return []


def _geometry_of(path):
    from dfmp2.io.xyz import read_xyz

    g = read_xyz(path)
    return list(g.symbols), g.coords_angstrom


@pytest.mark.parametrize("scf_mode", ["df", "pyscf-df"])
def test_rhf_and_uhf_results_have_the_same_keys_and_types(scf_mode):
    rhf, uhf = _json(WATER, scf_mode=scf_mode), _json(OH, scf_mode=scf_mode)
    assert rhf["schema_version"] == uhf["schema_version"] == SCHEMA_VERSION == "12"
    assert set(rhf) == set(uhf) == TOP_LEVEL
    assert _dotted_keys(rhf) == [] and _dotted_keys(uhf) == []
    for doc, path, mult in ((rhf, WATER, 1), (uhf, OH, 2)):
        symbols, xyz = _geometry_of(path)  # the geometry as run equals the input, in Ångström
        g = doc["geometry"]
        assert g["symbols"] == symbols and g["ghost"] == [False] * len(symbols)
        assert len(g["coordinates_angstrom"]) == len(symbols)
        for row, ref in zip(g["coordinates_angstrom"], xyz):
            assert row == pytest.approx(list(ref), abs=1e-12)
        assert doc["multiplicity"] == mult and doc["charge"] == 0 and isinstance(doc["multiplicity"], int)
        assert doc["wall_s"] >= sum(doc["timings"].values()) > 0 and doc["units"]["wall_s"] == "s"
        f = doc["flops"]  # schema 4: flops per timed stage, integers, linalg work wherever it ran
        assert list(f) == list(doc["timings"]) and all(isinstance(v, int) and v >= 0 for v in f.values())
        assert all(f[s] > 0 for s in ("metric", "transform", "fit", "pair")) and f["integrals"] == 0
        assert (f["scf"] > 0) == (scf_mode == "df") and doc["units"]["flops"] == "floating-point operations"
        assert doc["units"]["geometry"] == "angstrom"
        k = doc["ran"]["kernels"]
        assert isinstance(k, list) and k and all(set(x) == {"op", "kernel", "calls"} for x in k)
    assert rhf["spin"] is None and uhf["spin"]["reference"] == "UHF"
    rhf.pop("spin"), uhf.pop("spin")
    assert set(_shape(rhf)) == set(_shape(uhf))
    if scf_mode == "pyscf-df":  # the same SCF engine: the same types too (None where absent)
        a, b = _shape(rhf, ignore_none=True), _shape(uhf, ignore_none=True)
        assert {k: a[k] for k in a.keys() & b.keys()} == {k: b[k] for k in a.keys() & b.keys()}
    assert isinstance(rhf["ran"]["storage"]["occ_blocks"], list) and len(uhf["ran"]["storage"]["occ_blocks"]) == 2
    assert isinstance(rhf["ran"]["scf"]["precision"], dict) and isinstance(uhf["ran"]["scf"]["precision"], dict)


@pytest.mark.parametrize("scf_mode", ["df", "pyscf-df"])
def test_checkpoint_says_where_the_scf_came_from(tmp_path, scf_mode):
    ck = tmp_path / "ck.h5"
    fresh = run(WATER, RunOptions(scf_mode=scf_mode, checkpoint=str(ck)))
    assert fresh.ran["storage"]["from_checkpoint"] == {"scf": False, "B": False, "pairs": 0}
    assert fresh.ran["scf"]["source"] == "ran" and fresh.ran["scf"]["iterations"] > 0
    assert fresh.ran["scf"]["engine"] == ("dfmp2.scf" if scf_mode == "df" else "pyscf")
    again = run(WATER, RunOptions(scf_mode=scf_mode, resume=str(ck)))
    assert again.ran["storage"]["from_checkpoint"]["scf"] is True and again.ran["storage"]["from_checkpoint"]["B"]
    s = again.ran["scf"]
    assert s["source"] == "checkpoint" and s["checkpoint"] == str(ck) and s["engine"] == fresh.ran["scf"]["engine"]
    assert s["iterations"] == fresh.ran["scf"]["iterations"] and s["kernels"] == {}
    assert "scf" not in again.timings and again.e_hf == fresh.e_hf
