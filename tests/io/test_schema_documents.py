"""Every document a dfmp2 command writes with --json has its published schema and its own kind
(``dfmp2.io.schemas.kind``): run, gradient, optimize, frequencies, interaction, a CBS bracket and
the reports of compare, regress and bench, each made here and validated with jsonschema. The
frequency analysis's 19 gradients are a pair-spring model's (the document's shape, not its
numbers, is under test); the heavy test makes it from DF-MP2 gradients."""

import json

import jsonschema
import numpy as np
import pytest
from click.testing import CliRunner

from dfmp2.cli.main import main
from dfmp2.io import schemas
from dfmp2.workflows import frequencies as F

pytestmark = pytest.mark.usefixtures("one_torch_thread")

WATER = "3\nwater\nO 0.000 0.000 0.117\nH 0.000 0.757 -0.467\nH 0.000 -0.757 -0.467\n"
H2_DIMER = "4\nH2 dimer\nH 0.0 0.0 0.0\nH 0.0 0.0 0.74\nH 3.0 0.0 0.0\nH 3.0 0.0 0.74\n"
H2 = "2\nhydrogen\nH 0.0 0.0 0.0\nH 0.0 0.0 0.74\n"
FAST = ["--cpu-blas", "torch", "-q"]
# (schema name, input, the command's arguments after the input, the exit code)
COMMANDS = {
    "result": (WATER, ["run", "--basis", "sto-3g"], 0),
    "gradient": (WATER, ["gradient", "--basis", "sto-3g"], 0),
    "optimize": (WATER, ["optimize", "--basis", "sto-3g", "--max-steps", "1"], 2),  # not converged: still written
    "frequencies": (WATER, ["frequencies", "--basis", "sto-3g"], 0),
    "interaction": (H2_DIMER, ["interaction", "--basis", "6-31g", "--fragments", "1-2,3-4"], 0),
    "cbs": (H2, ["run", "--basis", "cc-pv[dt]z"], 0),
    "compare": (None, ["compare", "--synthetic", "3,10,12", "--devices", "cpu"], 0),
    "regress": (None, ["regress", "hydrogen_fluoride|cc-pvdz|cc-pvdz-ri|df|ae"], 0),
}


def springs(reference: np.ndarray):
    """(E, gradient) of unit springs between every pair of atoms at their ``reference`` lengths
    (Å in, Eh and Eh/bohr out): invariant under translations and rotations, stationary at the
    reference, so its harmonic analysis has 3N-6 positive modes."""
    ref = np.linalg.norm(reference[:, None] - reference[None], axis=-1)

    def evaluate(x):
        d = x[:, None] - x[None]
        r = np.linalg.norm(d, axis=-1)
        dr = np.where(r > 0, r - ref, 0.0)
        e = 0.25 * float((dr**2).sum())
        g = ((dr / np.where(r > 0, r, 1.0))[..., None] * d).sum(axis=1) * 0.529177210903  # per bohr
        return e, g

    return evaluate


def write(tmp_path, name: str, model_frequencies: bool = True) -> tuple[dict, str]:
    text, args, code = COMMANDS[name]
    xyz, out = tmp_path / f"{name}.xyz", tmp_path / f"{name}.json"
    if text is not None:
        xyz.write_text(text)
    extra = ["--output", str(tmp_path / "final.xyz")] if name == "optimize" else []
    with pytest.MonkeyPatch.context() as mp:
        if name == "frequencies" and model_frequencies:
            model = springs(np.loadtxt(str(xyz), skiprows=2, usecols=(1, 2, 3)))

            def evaluate(geom, options, method, world, progress=None, log=None):
                e, g = model(np.asarray(geom.coords_angstrom, dtype=np.float64))
                return [e, *g.ravel(), *[float("nan")] * 3], None

            mp.setattr(F, "evaluate_gradient", evaluate)
        given = [str(xyz)] if text is not None else []
        fast = FAST if name not in ("compare", "regress") else ["--cpu-blas", "torch"]  # they have no -q
        r = CliRunner().invoke(main, [args[0], *given, *args[1:], *fast, *extra, "--json", str(out)])
    assert r.exit_code == code, r.output
    return json.loads(out.read_text()), r.output


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_command_s_document_has_its_own_kind_and_meets_its_schema(tmp_path, name):
    """frequencies and optimize were labelled 'gradient' (both carry a gradient) and had no schema."""
    doc, _ = write(tmp_path, name)
    assert schemas.kind(doc) == name
    schemas.validate(doc, name)
    for other in set(schemas.NAMES) - {name}:  # each document meets its own schema only
        with pytest.raises(jsonschema.ValidationError):
            schemas.validate(doc, other)
    if name == "frequencies":
        sym = doc["symmetry"]
        assert sym["point_group"] == "C2v" and sym["symmetry_number"] == 2 and sym["source"]
        assert len(doc["frequencies"]) == 3 and min(doc["frequencies"]) > 0
    if name == "optimize":
        assert doc["optimization"]["converged"] is False and doc["optimization"]["steps"] == 1


def test_every_schema_is_some_command_s_document():
    assert set(schemas.NAMES) == {*COMMANDS, "bench"}


def test_a_bench_report_meets_its_schema(tmp_path):
    """dfmp2 bench's NAME.json on one tiny shape (run_bench and write_json, what the command calls)."""
    from dfmp2.benchmarks import report, shapes
    from dfmp2.benchmarks.run import BenchOptions, run_bench

    opts = BenchOptions(
        shapes=[shapes.parse_shape("4,20,60")],
        devices=["cpu"],
        precisions=["fp64"],
        ops=["gemm"],
        waters=[],
        warmup=0,
        repeats=1,
        min_time=0.0,
        max_time=0.2,
        peak_n=32,
        trn_validate=False,
    )
    report.write_json(run_bench(opts, log=lambda m: None), tmp_path / "b.json")
    doc = json.loads((tmp_path / "b.json").read_text())
    assert schemas.kind(doc) == "bench"
    schemas.validate(doc, "bench")
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate({k: v for k, v in doc.items() if k != "ops"}, "bench")


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["symmetry"].pop("symmetry_number"),
        lambda d: d["symmetry"].update(symmetry_number=0),
        lambda d: d.update(frequencies=["1663"]),
        lambda d: d.update(modes=[]),
    ],
)
def test_a_frequencies_document_missing_or_adding_a_key_fails(tmp_path, change):
    doc, _ = write(tmp_path, "frequencies")
    change(doc)
    with pytest.raises(jsonschema.ValidationError):
        schemas.validate(doc, "frequencies")


def test_kind_refuses_what_is_no_dfmp2_document():
    for doc in ({"schema_name": "qcschema_output"}, [1, 2]):
        with pytest.raises(ValueError, match="not a dfmp2 document"):
            schemas.kind(doc)


@pytest.mark.heavy
def test_frequencies_of_df_mp2_meet_their_schema(tmp_path):
    doc, _ = write(tmp_path, "frequencies", model_frequencies=False)
    schemas.validate(doc, schemas.kind(doc))
    assert doc["ir_intensities"] is not None and len(doc["ir_intensities"]) == 3
