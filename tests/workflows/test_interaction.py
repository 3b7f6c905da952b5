"""``dfmp2 interaction`` and ghost atoms.

The counterpoise-corrected interaction energies are checked against PySCF computed the same way,
independently of this program (``scripts/s22_interaction.py``'s ``pyscf_interaction``: ``pyscf.gto``
molecules with PySCF's own 'ghost-' atoms, PySCF's DF-RHF (cc-pVDZ-JKFIT) and
``pyscf.mp.dfmp2.DFMP2`` (cc-pVDZ-RI)), on S22 dimers.
"""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from cli_checks import assert_one_line_error
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.errors import InputError
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.xyz import parse_xyz, read_xyz
from dfmp2.options import RunOptions
from dfmp2.workflows import interaction

ROOT = Path(__file__).resolve().parents[2]
S22 = ROOT / "inputs" / "s22"
WATER_DIMER = S22 / "s22_02_water_dimer.xyz"
TOL = 1e-9  # Hartree, the acceptance bound on CP-corrected ΔE against PySCF
H2_DIMER = "4\n(H2)2 charge=0 multiplicity=1\nH 0 0 0\nH 0 0 0.74\n--\nH 0 3.0 0\nH 0 3.0 0.74\n"


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def write(tmp_path, text, name="mol.xyz"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


# ---- PySCF, the same way, on its own: scripts/s22_interaction.py's reference -----------------
def _s22_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("s22_interaction", ROOT / "scripts" / "s22_interaction.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.heavy
@pytest.mark.parametrize("name,fragments", [("s22_02_water_dimer", "1-3,4-6"), ("s22_01_ammonia_dimer", "1-4,5-8")])
def test_interaction_energies_match_pyscf_with_ghost_atoms(tmp_path, name, fragments):
    """CLI with --json; CP-corrected (and uncorrected) ΔE(HF, MP2, SCS-MP2) within 1e-9 Eh of
    PySCF's; the JSON's per-fragment energies give its ΔE and its kcal/mol."""
    path = S22 / f"{name}.xyz"
    out = tmp_path / "ie.json"
    res = CliRunner().invoke(main, ["interaction", str(path), "--fragments", fragments, "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert "CP-corrected" in res.output and "kcal/mol" in res.output
    d = json.loads(out.read_text())
    frag_atoms = [[a - 1 for a in f["atoms"]] for f in d["fragments"]]
    ref = _s22_script().pyscf_interaction(path, frag_atoms)
    for key in ("cp", "nocp"):
        for m in interaction.METHODS:
            got = d["interaction_energies"][key][m]
            assert abs(got["hartree"] - ref[key][m]) <= TOL, (key, m, got["hartree"], ref[key][m])
            assert got["kcal_per_mol"] == pytest.approx(got["hartree"] * 627.5094740631, rel=1e-12)
    full = d["full_system"]["energies"]
    for key, part in (("cp", "energies_full_basis"), ("nocp", "energies_own_basis")):
        delta = full["e_mp2"] - sum(f[part]["e_mp2"] for f in d["fragments"])
        assert delta == pytest.approx(d["interaction_energies"][key]["MP2"]["hartree"], abs=1e-13)
    assert [r["kind"] for r in d["runs"]] == ["full", "cp", "cp", "own", "own"]
    assert d["runs"][1]["result"]["formula"].endswith("ghost atoms")
    assert d["ran"]["device"] == "cpu" and d["ran"]["precision"] == "fp64"


# ---- ghost atoms -----------------------------------------------------------------------------
def _water_in_dimer_basis():
    geom = read_xyz(WATER_DIMER)
    return geom, replace(geom, ghost=(False,) * 3 + (True,) * 3)


def test_ghost_atoms_carry_basis_but_no_charge_or_electrons():
    geom, ghosted = _water_in_dimer_basis()
    dimer = molecule.build_molecule(geom)
    mono = molecule.build_molecule(replace(geom, symbols=geom.symbols[:3], coords_angstrom=geom.coords_angstrom[:3]))
    mol = molecule.build_molecule(ghosted)
    assert mol.nelectron == mono.nelectron == 10
    assert mol.energy_nuc() == pytest.approx(mono.energy_nuc(), abs=1e-12)
    assert mol.nao_nr() == dimer.nao_nr() == 2 * mono.nao_nr()
    assert list(mol.atom_charges()) == [8, 1, 1, 0, 0, 0]
    assert molecule.frozen_core_count(mol) == molecule.frozen_core_count(mono) == 1  # ghosts: no core
    # both fitting sets of the element on the ghosts: the same auxiliary size as the dimer
    for kind in ("jk", "mp2"):
        spec = basis.default_auxbasis(mol, kind)
        assert spec == basis.default_auxbasis(dimer, kind) and set(spec) == {"O", "H"}
        assert basis.make_auxmol(mol, spec).nao_nr() == basis.make_auxmol(dimer, spec).nao_nr()
    assert basis.make_auxmol(mol, basis.mp2_auxbasis(mol, "cc-pvdz-ri")).nao_nr() == 168
    # hcore sees no ghost nucleus: the one-electron operator differs from the dimer's
    assert not np.allclose(mol.intor("int1e_nuc"), dimer.intor("int1e_nuc"))


def test_ghost_on_top_of_a_real_atom_is_refused():
    geom = read_xyz(WATER_DIMER)
    g = replace(
        geom,
        symbols=geom.symbols + ("O",),
        coords_angstrom=np.vstack([geom.coords_angstrom, geom.coords_angstrom[:1] + 0.01]),
        ghost=(False,) * 6 + (True,),
    )
    with pytest.raises(InputError, match=r"atoms 1 \(O\) and 7 \(ghost O\) are 0\.0173 Å apart"):
        molecule.build_molecule(g)


def test_only_ghost_atoms_is_refused():
    geom = read_xyz(WATER_DIMER)
    with pytest.raises(InputError, match="every atom is a ghost"):
        molecule.build_molecule(replace(geom, ghost=(True,) * 6))


def test_ghosted_fragment_through_trn1_simulate_matches_cpu():
    """A fragment in the full basis (ghosts) through the NKI path on this CPU (fp32) against fp64."""
    geom = parse_xyz(H2_DIMER, "h2h2.xyz")
    frags = interaction.resolve_fragments(geom)
    _, _, ghosted = interaction.run_geometries(geom, frags)[1]
    assert ghosted.ghost == (False, False, True, True)
    ref = run(ghosted, RunOptions(device="cpu"))
    got = run(ghosted, RunOptions(device="trn1", simulate=True))
    assert got.ran["simulated"] and got.ran["precision"] == "fp32"
    assert got.nbasis == ref.nbasis == 20
    assert abs(got.e_hf - ref.e_hf) < 1e-8  # our DF-RHF on trn1 (fp32 cycles) against fp64
    assert got.ran["scf"]["device"] == "trn1"
    assert abs(got.e_corr - ref.e_corr) < 1e-6


@pytest.mark.cuda
def test_interaction_on_cuda_matches_cpu():
    """The 5 runs of the water dimer on one CUDA backend (fp64): the same ΔE as on the CPU."""
    geom = read_xyz(WATER_DIMER)
    frags = interaction.resolve_fragments(geom, "1-3,4-6")
    cpu = interaction.run_interaction(geom, frags, RunOptions(device="cpu"))
    gpu = interaction.run_interaction(geom, frags, RunOptions(device="cuda"))
    assert gpu.ran["device"].startswith("cuda")
    for key in ("cp", "nocp"):
        for m in interaction.METHODS:
            assert abs(gpu.deltas[key][m] - cpu.deltas[key][m]) < 1e-10, (key, m)


# ---- fragments: the XYZ convention and the options ------------------------------------------
def test_xyz_fragment_lines():
    g = parse_xyz(H2_DIMER, "h2h2.xyz")
    assert g.natm == 4 and g.fragments == ((0, 1), (2, 3))
    assert parse_xyz(H2_DIMER.replace("--\n", ""), "x").fragments == ()


@pytest.mark.parametrize(
    "text,match",
    [
        ("2\n\n--\nH 0 0 0\nH 0 0 1\n", r"x\.xyz:3: fragment separator '--' with no atom lines before it"),
        ("2\n\nH 0 0 0\n--\n--\nH 0 0 1\n", r"x\.xyz:5: .* between it and the '--' above"),
        ("2\n\nH 0 0 0\nH 0 0 1\n--\n\n", r"x\.xyz:5: .* no atom lines after it"),
        ("3\n\nH 0 0 0\n--\nH 0 0 1\n", r"atom count mismatch: line 1 says 3 atoms, found 2"),
    ],
)
def test_xyz_fragment_line_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_xyz(text, "x.xyz")


H2_DIMER_STATES = "4\n(H2)2 with Psi4's fragment lines\n0 1\nH 0 0 0\nH 0 0 0.74\n--\n+1 2\nH 0 3.0 0\nH 0 3.0 0.74\n"


def test_xyz_charge_multiplicity_lines_per_fragment():
    g = parse_xyz(H2_DIMER_STATES, "x.xyz")
    assert g.natm == 4 and g.fragments == ((0, 1), (2, 3)) and g.fragment_states == ((0, 1), (1, 2))
    f = interaction.resolve_fragments(g)
    assert f.charges == (0, 1) and f.multiplicities == (1, 2)
    assert f.total_charge == 1 and f.total_multiplicity == 2
    with pytest.raises(InputError, match="given twice"):
        interaction.resolve_fragments(g, charges="0,1")
    with pytest.raises(
        InputError,
        match="the fragments' 'charge multiplicity' lines add up to "
        r"\+1, but the total charge is 0 \(the given charge\)",
    ) as e:
        interaction.resolve_fragments(g, charge=0)
    assert e.value.option == ("charge",)


@pytest.mark.parametrize(
    "text,match",
    [
        (H2_DIMER_STATES.replace("0 1\n", ""), r"x\.xyz:6: fragment 1 has no 'charge multiplicity' line"),
        (H2_DIMER_STATES.replace("+1 2", "1 0"), r"x\.xyz:7: multiplicity must be 1 or more"),
        # only a fragment's first line may be 'charge multiplicity'
        (H2_DIMER_STATES.replace("H 0 0 0.74\n", "0 1\n"), r"x\.xyz:5: expected 'symbol x y z'"),
    ],
)
def test_xyz_charge_multiplicity_line_errors(text, match):
    with pytest.raises(InputError, match=match):
        parse_xyz(text, "x.xyz")


def test_fragments_from_xyz_lines_equal_the_option(tmp_path):
    path = write(tmp_path, H2_DIMER)
    geom = read_xyz(path)
    by_lines = interaction.run_interaction(geom, interaction.resolve_fragments(geom), RunOptions())
    plain = parse_xyz(H2_DIMER.replace("--\n", ""), path)
    by_option = interaction.run_interaction(plain, interaction.resolve_fragments(plain, "1-2,3-4"), RunOptions())
    assert by_lines.deltas == by_option.deltas
    assert by_lines.fragments.source == "XYZ (-- lines)"


def test_parse_fragments_ranges_and_joins():
    assert interaction.parse_fragments("1-3+7,4-6", 7) == ((0, 1, 2, 6), (3, 4, 5))
    assert interaction.format_atoms((0, 1, 2, 6)) == "1-3+7"


def test_charges_and_multiplicities_resolve():
    geom = read_xyz(WATER_DIMER)
    f = interaction.resolve_fragments(replace(geom, charge=None, multiplicity=None), "1-3,4-6", "1,-1", "2,2")
    assert f.charges == (1, -1) and f.total_charge == 0 and f.total_multiplicity == 3  # high spin
    f = interaction.resolve_fragments(geom, "1-3,4-6", "1,-1", "2,2")
    assert f.total_multiplicity == 1  # the XYZ comment's


ERRORS = [  # (extra arguments, words in the one error line)
    (["--fragments", "1-3"], ["atoms 4-6 are in no fragment"]),
    (["--fragments", "1-6"], ["only one fragment"]),
    (["--fragments", "1-3,3-6"], ["atom 3 is in fragments 1 and 2"]),
    (["--fragments", "1-3+2,4-6"], ["atom 2 is twice in fragment 1"]),
    (["--fragments", "1-3,4-5"], ["atom 6 is in no fragment"]),
    (["--fragments", "1-3,4-7"], ["atom 7 is out of range", "6 atoms"]),
    (["--fragments", "0-3,4-6"], ["atom 0 is out of range"]),
    (["--fragments", "3-1,4-6"], ["range '3-1' is empty"]),
    (["--fragments", "1-3,x"], ["'x' is not an atom number or range"]),
    (["--fragments", "1-3,,4-6"], ["fragments '1-3,,4-6': fragment 2 is empty", "(--fragments)"]),
    (["--fragments", "1-3,4-6", "--fragment-charges", "1,0"], ["add up to +1", "total charge is 0"]),
    (["--fragments", "1-3,4-6", "--fragment-charges", "0"], ["1 value for 2 fragments"]),
    (["--fragments", "1-3,4-6", "--fragment-charges", "0,a"], ["'a' is not an integer"]),
    (["--fragments", "1-3,4-6", "--charge", "2"], ["total charge is +2", "--fragment-charges"]),
    (["--fragments", "1-3,4-6", "--fragment-multiplicities", "1,0"], ["0 is not a multiplicity"]),
    (["--fragments", "1-3,4-6", "--fragment-multiplicities", "2,1"], ["total multiplicity 1 cannot"]),
    (["--fragments", "1-3,4-6", "--json", "/nonexistent-dir/x.json"], ["--json", "does not exist"]),
    (["--fragments", "1-3,4-6", "--basis", "no-such-basis"], ["basis 'no-such-basis'"]),
]


@pytest.mark.parametrize("args,words", ERRORS, ids=[" ".join(a) for a, _ in ERRORS])
def test_wrong_fragments_are_one_error_line_before_any_work(args, words, no_scf):
    res = CliRunner().invoke(main, ["interaction", str(WATER_DIMER), *args])
    assert_one_line_error(res, *words)


def test_no_fragments_and_fragments_twice(tmp_path, no_scf):
    assert_one_line_error(
        CliRunner().invoke(main, ["interaction", str(WATER_DIMER)]), "no fragments", "--fragments", "'--' lines"
    )
    path = write(tmp_path, H2_DIMER)
    assert_one_line_error(
        CliRunner().invoke(main, ["interaction", path, "--fragments", "1-2,3-4"]), "fragments are given twice"
    )


def test_a_fragment_that_cannot_run_stops_before_the_first_scf(no_scf):
    """H2 with charge -4 (6 electrons, more than its 1s shells hold) as the last fragment:
    refused before the full system's SCF, though the full system and fragment 1 could run."""
    res = CliRunner().invoke(
        main, ["interaction", str(WATER_DIMER), "--fragments", "1-4,5-6", "--fragment-charges", "4,-4"]
    )
    assert_one_line_error(res, "fragment 2 (atoms 5-6)", "6 electrons")


@pytest.mark.heavy
def test_open_shell_fragment_matches_pyscf_dfump2(tmp_path):
    """A radical fragment with water: HO...OH2 (the water dimer less the donor's free H, so OH
    donates the hydrogen bond). The OH runs and the full system (doublets) run DF-UMP2 on UHF,
    the water runs DF-MP2 on RHF; CP and uncorrected ΔE within 1e-9 Eh of PySCF (DF-UHF + DFUMP2,
    DF-RHF + DFMP2, ghost atoms) computed the same way."""
    lines = WATER_DIMER.read_text().splitlines()[2:8]
    path = tmp_path / "hydroxyl_water.xyz"
    path.write_text("5\nHO...OH2 charge=0 multiplicity=2\n" + "\n".join([lines[0], lines[2], *lines[3:6]]) + "\n")
    out = tmp_path / "ie.json"
    res = CliRunner().invoke(
        main,
        [
            "interaction",
            str(path),
            "--fragments",
            "1-2,3-5",
            "--fragment-multiplicities",
            "2,1",
            "--json",
            str(out),
            "-q",
        ],
    )
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert [r["result"].get("spin") is not None for r in d["runs"]][:2] == [True, True]
    ref = _s22_script().pyscf_interaction(path, [[0, 1], [2, 3, 4]], states=[(0, 1), (0, 0)], total=(0, 1))
    for key in ("cp", "nocp"):
        for m in interaction.METHODS:
            got = d["interaction_energies"][key][m]["hartree"]
            assert abs(got - ref[key][m]) <= TOL, (key, m, got, ref[key][m])


# ---- fuzz: whatever the fragment options and lines hold, exit 0 or one error line ------------

FUZZ = settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
REFUSED_MEMORY = "0.001MB"  # below any memory plan: a run that passes every check stops before the SCF


def _fuzz_check(args):
    res = CliRunner().invoke(main, ["interaction", *args, "-q", "--memory", REFUSED_MEMORY])
    assert res.exit_code == 2, (args, res.exit_code, res.output, res.exc_info)  # never reaches an SCF
    assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exc_info)
    err = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in res.output, (args, res.stderr)


OPTION_TEXT = st.text(alphabet="0123456789-+, x", max_size=12)


@FUZZ
@given(
    frags=st.one_of(st.none(), OPTION_TEXT),
    charges=st.one_of(st.none(), OPTION_TEXT),
    mults=st.one_of(st.none(), OPTION_TEXT),
    charge=st.one_of(st.none(), st.integers(-3, 3)),
)
def test_fuzz_fragment_options(frags, charges, mults, charge):
    args = [str(WATER_DIMER)]
    for opt, v in (
        ("--fragments", frags),
        ("--fragment-charges", charges),
        ("--fragment-multiplicities", mults),
        ("--charge", charge),
    ):
        if v is not None:
            args += [opt, str(v)]
    _fuzz_check(args)


@FUZZ
@given(
    extra=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(["--", "0 1", "1 2", "-1 1", "0 0", " -- ", "1"])), max_size=4
    )
)
def test_fuzz_fragment_lines(tmp_path_factory, extra):
    lines = H2_DIMER_STATES.splitlines()
    for pos, text in extra:
        lines.insert(2 + min(pos, len(lines) - 2), text)
    path = tmp_path_factory.mktemp("fz") / "x.xyz"
    path.write_text("\n".join(lines) + "\n")
    _fuzz_check([str(path)])


def test_a_failing_run_is_named(tmp_path):
    """Which of the 2N+1 runs failed: an SCF that does not converge in the full system says so,
    with the option that would help."""
    res = CliRunner().invoke(main, ["interaction", str(WATER_DIMER), "--fragments", "1-3,4-6", "--scf-max-cycle", "3"])
    assert_one_line_error(res, "run 1/5 (full system): RHF did not converge in 3 cycles")
    assert "(--scf-max-cycle)" in res.output
