"""Energy regression: the program's DF-MP2 against PySCF's own DF-MP2 (inputs/references.json).

Default channel: the fast subset (both SCF modes, both frozen-core settings) in fp64 and fp32.
Slow channel (--slow): every other regression case, fp64 and fp32.
Tolerances on E_corr and E_HF: 1e-9 Eh (fp64), 1e-6 Eh (fp32). The largest errors seen per precision
are printed in the terminal summary and written to <pytest basetemp>/regression_errors.json.

The fp32 run of a case reuses the converged RHF (or UHF) of its fp64 run (the SCF is fp64 in both
precisions on the CPU: ours for 'df' RHF and UHF, PySCF's for 'exact'), which halves the slow
channel's time; the MP2 part runs afresh.
"""

import json

import pytest
from click.testing import CliRunner

import dfmp2.scf.driver
import dfmp2.scf.pyscf_scf
import dfmp2.scf.settings
from dfmp2.cli.regress import regress_command
from dfmp2.options import RunOptions
from dfmp2.workflows.regress import REFERENCES, TOLERANCES, find_reference, load_references, run_case, select_cases

REFS = load_references()
_ERRORS = []  # one record per (case, precision) that ran


def _params(subset, marks=()):
    return [
        pytest.param(e["key"], p, id=f"{e['key']}-{p}", marks=marks)
        for e in REFS.values()
        if e["subset"] == subset
        for p in ("fp64", "fp32")
    ]


# --- one RHF per case shared by its fp64 and fp32 runs ------------------------------------------
@pytest.fixture(scope="module")
def shared_rhf():
    last = {}

    def shared(real):
        def run(mol, scf_mode="df", max_cycle=dfmp2.scf.pyscf_scf.SCF_MAX_CYCLE, **kw):
            key = (real.__name__, mol.atom.__repr__(), repr(mol.basis), mol.charge, mol.spin, scf_mode, max_cycle)
            if key not in last:
                last.clear()  # keep one: a DF-SCF object can hold GBs of integrals
                last[key] = real(mol, scf_mode, max_cycle=max_cycle, **kw)
            return last[key]

        return run

    run_rhf, run_uhf = shared(dfmp2.scf.pyscf_scf.run_rhf), shared(dfmp2.scf.pyscf_scf.run_uhf)

    real_df = dfmp2.scf.driver.run_scf

    def run_scf(mol, backend, settings=dfmp2.scf.settings.DEFAULT_SETTINGS, **kw):
        key = (
            mol.atom.__repr__(),
            repr(mol.basis),
            mol.charge,
            mol.spin,
            settings.unrestricted,
            "df-scf",
            backend.name,
            settings.max_cycle,
        )
        if key not in last:
            last.clear()
            last[key] = real_df(mol, backend, settings, **kw)
        return last[key]

    mp = pytest.MonkeyPatch()
    mp.setattr(dfmp2.scf.pyscf_scf, "run_rhf", run_rhf)
    mp.setattr(dfmp2.scf.pyscf_scf, "run_uhf", run_uhf)
    mp.setattr(dfmp2.scf.driver, "run_scf", run_scf)
    yield
    mp.undo()


# --- report of the largest errors --------------------------------------------------------------
class _Report:
    def __init__(self, path):
        self.path = path

    def pytest_terminal_summary(self, terminalreporter):
        if not _ERRORS:
            return
        tr = terminalreporter
        tr.section("DF-MP2 regression vs PySCF references")
        doc = {}
        for prec in ("fp64", "fp32"):
            rows = [r for r in _ERRORS if r["precision"] == prec]
            if not rows:
                continue
            worst = max(rows, key=lambda r: abs(r["d_e_corr"]))
            worst_hf = max(rows, key=lambda r: abs(r["d_e_hf"]))
            doc[prec] = {
                "cases": len(rows),
                "tolerance": TOLERANCES[prec],
                "max_abs_d_e_corr": abs(worst["d_e_corr"]),
                "case": worst["key"],
                "max_abs_d_e_hf": abs(worst_hf["d_e_hf"]),
                "case_hf": worst_hf["key"],
            }
            tr.write_line(
                f"{prec}: {len(rows)} case(s); largest |dE_corr| = {abs(worst['d_e_corr']):.2e} Eh "
                f"({worst['key']}), largest |dE_HF| = {abs(worst_hf['d_e_hf']):.2e} Eh; "
                f"tolerance {TOLERANCES[prec]:.0e} Eh"
            )
        self.path.write_text(json.dumps({"summary": doc, "cases": _ERRORS}, indent=1) + "\n")
        tr.write_line(f"details: {self.path}")


@pytest.fixture(scope="session", autouse=True)
def _regression_report(request, tmp_path_factory):
    plugin = _Report(tmp_path_factory.getbasetemp() / "regression_errors.json")
    request.config.pluginmanager.register(plugin, "dfmp2-regression-report")
    yield


def _check(key, precision):
    res = run_case(REFS[key], RunOptions(device="cpu", precision=precision))
    assert res.error is None, res.error
    _ERRORS.append(
        {
            "key": key,
            "precision": precision,
            "d_e_corr": res.diff["e_corr"],
            "d_e_hf": res.diff["e_hf"],
            "d_e_os": res.diff["e_os"],
            "d_e_ss": res.diff["e_ss"],
            "nbasis": res.nbasis,
            "seconds": round(res.seconds, 2),
        }
    )
    tol = TOLERANCES[precision]
    assert abs(res.diff["e_hf"]) <= tol, f"E_HF off by {res.diff['e_hf']:+.3e} Eh"
    assert abs(res.diff["e_corr"]) <= tol, f"E_corr off by {res.diff['e_corr']:+.3e} Eh"
    assert res.passed


@pytest.mark.parametrize("key,precision", _params("fast"))
def test_fast_subset(key, precision, shared_rhf):
    _check(key, precision)


@pytest.mark.parametrize("key,precision", _params("full", marks=pytest.mark.slow))
def test_full_set(key, precision, shared_rhf):
    _check(key, precision)


# --- the reference lookup ----------------------------------------------------------------------
def test_find_reference_by_settings():
    e = find_reference(REFS, "water", scf_mode="exact", frozen_core=True)
    assert e["key"] == "water|cc-pvdz|cc-pvdz-ri|exact|fc"
    assert find_reference(REFS, "water", auxbasis="cc-pVDZ-RI")["key"] == "water|cc-pvdz|cc-pvdz-ri|df|ae"
    with pytest.raises(KeyError):
        find_reference(REFS, "water", basis="cc-pvtz")


def test_subsets_nest():
    fast = {e["key"] for e in select_cases(REFS, "fast")}
    full = {e["key"] for e in select_cases(REFS, "full")}
    every = {e["key"] for e in select_cases(REFS, "all")}
    assert fast < full <= every
    assert {e["key"] for e in select_cases(REFS, "all", ["h2o_0?"])} >= {
        "h2o_01|cc-pvdz|cc-pvdz-ri|df|ae",
        "h2o_08|cc-pvdz|cc-pvdz-ri|df|ae",
    }


# --- the `dfmp2 regress` command ---------------------------------------------------------------
ONE = "water|cc-pvdz|cc-pvdz-ri|df|fc"


def test_regress_command_passes_and_writes_json(tmp_path):
    out = tmp_path / "regress.json"
    r = CliRunner().invoke(regress_command, [ONE, "--device", "cpu", "--precision", "fp32", "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "water" in r.output and "pass" in r.output and "1/1 passed" in r.output
    doc = json.loads(out.read_text())
    assert doc["meta"]["precision"] == "fp32" and doc["summary"]["failed"] == 0
    case = doc["cases"][0]
    assert case["key"] == ONE and abs(case["diff"]["e_corr"]) <= 1e-6
    assert case["ran"]["precision"] == "fp32" and case["ran"]["device"] == "cpu"


def test_regress_command_fails_on_a_wrong_reference(tmp_path):
    data = json.loads(REFERENCES.read_text())
    data["references"][ONE]["e_corr"] += 1e-6
    bad = tmp_path / "inputs" / "references.json"  # entry paths resolve against tmp_path
    bad.parent.mkdir()
    bad.write_text(json.dumps(data))
    (tmp_path / "inputs" / "water.xyz").write_text((REFERENCES.parent / "water.xyz").read_text())
    r = CliRunner().invoke(regress_command, [ONE, "--references", str(bad)])
    assert r.exit_code == 1, r.output
    assert "FAIL" in r.output and "0/1 passed" in r.output


@pytest.mark.parametrize(
    "args,message",
    [
        (["--device", "nonsense"], "unknown device"),
        (["no_such_molecule"], "no reference case matches"),
        (["--references", "/nonexistent/references.json"], "no reference file"),
    ],
)
def test_regress_command_user_errors(args, message):
    r = CliRunner().invoke(regress_command, args)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_regress_list_patterns_stay_within_full_but_exact_names_reach_large():
    r = CliRunner().invoke(regress_command, ["--list", "h2o_*"])
    assert r.exit_code == 0 and "h2o_16|" in r.output and "h2o_24|" not in r.output
    r = CliRunner().invoke(regress_command, ["--list", "h2o_24"])
    assert r.exit_code == 0 and "h2o_24|" in r.output


@pytest.mark.parametrize(
    "doc,message",
    [
        ({"references": {"a": {"x": 1}}}, "entry \"a\" field 'key' must be str"),
        ({"references": [1, 2]}, "non-empty object"),
        ({"references": {}}, "non-empty object"),
        ({"references": {"a": 5}}, 'entry "a" is not an object'),
        ([], "not a reference file"),
        ("CHANGE_E_CORR", "field 'e_corr' must be float"),
        ("CHANGE_NBASIS", "field 'nbasis' must be int"),
    ],
)
def test_references_of_the_wrong_shape_are_one_error_line(tmp_path, doc, message):
    """Valid JSON that is not a reference file: one error line and exit 2 before any case runs
    (it was a KeyError)."""
    if isinstance(doc, str):
        data = json.loads(REFERENCES.read_text())
        entry = data["references"][ONE]
        if doc == "CHANGE_E_CORR":
            entry["e_corr"] = "-0.2"
        else:
            entry["nbasis"] = True
        doc = data
    bad = tmp_path / "refs.json"
    bad.write_text(json.dumps(doc))
    r = CliRunner().invoke(regress_command, [ONE, "--references", str(bad)])
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert r.exit_code == 2 and lines == [ln for ln in lines if ln.startswith("error:")], r.output
    assert len(lines) == 1 and message in lines[0], r.output
