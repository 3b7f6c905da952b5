"""Open shells: DF-UMP2 on a UHF reference.

The energies against PySCF's DFUMP2 are in the regression suite (inputs/references.json, open-shell
cases, fp64 1e-9 and fp32 1e-6 Eh). Here: the opposite-spin pair op on every path against the
einsum reference, UHF on a closed shell = RHF to 1e-10 Eh, trn1 --simulate on OH against CPU fp64,
what the JSON records, out of core = in memory, and the one-line refusals.
"""

import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from dfmp2 import linalg
from dfmp2.cli.main import main
from dfmp2.df import basis
from dfmp2.errors import InputError
from dfmp2.interfaces.api import run
from dfmp2.io import molecule
from dfmp2.io.xyz import parse_xyz
from dfmp2.linalg.reference import mp2_pair_energy_reference
from dfmp2.options import RunOptions
from dfmp2.scf import driver, pyscf_scf

INPUTS = Path(__file__).resolve().parents[2] / "inputs"
OH = INPUTS / "open_shell" / "hydroxyl.xyz"
WATER = INPUTS / "water.xyz"


def _one_error_line(res, *fragments):
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert "Traceback" not in res.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])


def _opposite_problem(ni=3, nj=2, nvir=19, nvir_j=23, naux=150, seed=3):
    """B^alpha and B^beta blocks of different nocc and nvir over one naux (fp64, Hartree)."""
    g = torch.Generator().manual_seed(seed)
    Bi = torch.randn(ni, nvir, naux, generator=g, dtype=torch.float64) * 0.05
    Bj = torch.randn(nj, nvir_j, naux, generator=g, dtype=torch.float64) * 0.05
    ei = -0.5 - torch.rand(ni, generator=g, dtype=torch.float64)
    ej = -0.5 - torch.rand(nj, generator=g, dtype=torch.float64)
    ev = 0.1 + torch.rand(nvir, generator=g, dtype=torch.float64)
    evj = 0.1 + torch.rand(nvir_j, generator=g, dtype=torch.float64)
    return Bi, Bj, ei, ej, ev, evj


# --- the opposite-spin pair op ---------------------------------------------------------------
def test_torch_opposite_spin_equals_einsum_in_chunks():
    Bi, Bj, ei, ej, ev, evj = _opposite_problem()
    ref = mp2_pair_energy_reference(Bi, Bj, ei, ej, ev, eps_vir_j=evj)
    # a chunk of one j at a time, and all at once: the same sum
    for chunk in (19 * 23, 1 << 20):
        os_, ss_ = linalg.torch_ops.mp2_pair_energy(Bi, Bj, ei, ej, ev, eps_vir_j=evj, max_block_elems=chunk)
        assert abs(os_ - ref[0]) <= 1e-14 * abs(ref[0]) and math.isnan(ss_)
    # same-spin K with the same virtuals on both sides is the plain op's e_os
    same = linalg.mp2_pair_energy(Bi, Bi, ei, ei, ev, eps_vir_j=ev)
    assert same[0] == pytest.approx(linalg.mp2_pair_energy(Bi, Bi, ei, ei, ev)[0], rel=1e-14)
    with pytest.raises(ValueError, match="symmetric=True needs Bj to be Bi"):
        linalg.mp2_pair_energy(Bi, Bi, ei, ei, ev, eps_vir_j=ev, symmetric=True)
    with pytest.raises(ValueError, match="differ in naux"):
        linalg.mp2_pair_energy(Bi, Bj[..., :-1], ei, ej, ev, eps_vir_j=evj)


def test_nki_opposite_spin_kernel_on_the_emulator():
    """The NKI pair kernel's opposite form (rectangular K, ragged 128-row tiles, occupied blocks
    larger than one launch) through the trn1 backend on the NumPy emulator, fp32 on the device."""
    from dfmp2.linalg.neuron import make_neuron_backend

    be = make_neuron_backend("trn1", simulate=True, engine="nki-numpy-emulator")
    Bi, Bj, ei, ej, ev, evj = _opposite_problem(ni=3, nj=2, nvir=140, nvir_j=150, naux=200)
    ref = mp2_pair_energy_reference(Bi.float(), Bj.float(), ei, ej, ev, eps_vir_j=evj, k_dtype=torch.float32)
    os_, ss_ = be.mp2_pair_energy(Bi.float(), Bj.float(), ei, ej, ev, eps_vir_j=evj)
    assert abs(os_ - ref[0]) <= 1e-6 * abs(ref[0]) and math.isnan(ss_), (os_, ref)
    assert be.kernels_used.get("mp2_pair_energy:nki.mp2_pair")


# --- the pipeline ----------------------------------------------------------------------------
def test_uhf_on_a_closed_shell_equals_rhf():
    """--reference uhf on water: the UHF converges to the RHF and E_OS (alpha-beta) and E_SS
    (alpha-alpha + beta-beta) reduce to RHF's, to 1e-10 Eh; frozen core too."""
    for fc in (False, True):
        r = run(WATER, RunOptions(frozen_core=fc))
        u = run(WATER, RunOptions(frozen_core=fc, reference="uhf"))
        assert r.spin is None and u.spin["reference"] == "UHF"
        assert u.spin["nocc_alpha"] == u.spin["nocc_beta"] == r.nocc
        assert abs(u.e_hf - r.e_hf) <= 1e-10
        assert abs(u.e_os - r.e_os) <= 1e-10 and abs(u.e_ss - r.e_ss) <= 1e-10
        assert abs(u.spin["e_corr_aa"] - u.spin["e_corr_bb"]) <= 1e-10
        assert abs(u.spin["s2"]) < 1e-8 and u.spin["s2_exact"] == 0


def test_cli_json_records_the_open_shell(tmp_path):
    out = tmp_path / "oh.json"
    res = CliRunner().invoke(main, ["run", str(OH), "--json", str(out), "-q"])
    assert res.exit_code == 0, res.output
    assert "DF-UMP2" in res.output
    d = json.loads(out.read_text())
    sp = d["spin"]
    assert sp["reference"] == "UHF" and sp["multiplicity"] == 2 and sp["s2_exact"] == 0.75
    assert 0.75 <= sp["s2"] < 0.76 and sp["s2_warn_above"] == pyscf_scf.S2_WARN
    assert (sp["nocc_alpha"], sp["nocc_beta"], sp["nvir_alpha"], sp["nvir_beta"]) == (5, 4, 14, 15)
    e = d["energies"]
    assert e["e_corr_os"] == pytest.approx(sp["e_corr_ab"], abs=0)
    assert e["e_corr_ss"] == pytest.approx(sp["e_corr_aa"] + sp["e_corr_bb"], abs=1e-15)
    assert e["e_corr_sos"] == pytest.approx(1.3 * e["e_corr_os"], rel=1e-15)
    assert d["warnings"] == []  # OH: <S^2> 0.7547, no contamination warning


def test_out_of_core_equals_in_memory_bitwise(tmp_path):
    """B^alpha and B^beta on disk (two HDF5 stores), small blocks so the cross-spin loop reads
    several blocks of each: the same bits as in memory, and the scratch files are gone."""
    opts = dict(occ_block_max=2)
    mem = run(OH, RunOptions(storage="memory", **opts))
    disk = run(OH, RunOptions(storage="disk", scratch_dir=str(tmp_path), **opts))
    assert disk.ran["storage"]["B"] == "disk (HDF5)" and disk.ran["storage"]["occ_blocks"] == [3, 2]
    assert (disk.e_os, disk.e_ss) == (mem.e_os, mem.e_ss)
    assert disk.spin == mem.spin
    assert list(tmp_path.iterdir()) == []


def test_spin_contamination_is_warned():
    """CN's UHF has <S^2> = 1.02 for a doublet (excess 0.27 > 0.1): one warning naming both."""
    r = run(INPUTS / "open_shell" / "cyano.xyz", RunOptions())
    w = [x for x in r.warnings if x.startswith("spin contamination")]
    assert len(w) == 1 and "1.0198" in w[0] and "0.7500" in w[0], r.warnings


def test_one_electron_has_no_correlation():
    """The H atom (a doublet by default: no multiplicity given) runs and has E_corr 0; the
    default multiplicity is said."""
    r = run(parse_xyz("1\n\nH 0 0 0\n", "h.xyz"), RunOptions())
    assert r.spin["nocc_beta"] == 0 and abs(r.e_corr) <= 1e-14
    assert any("taken as a doublet" in w for w in r.warnings)


# --- refusals --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args,fragments",
    [
        (["--reference", "rohf"], ["ROHF references are not supported", "use a UHF reference", "(--reference)"]),
        (["--reference", "rhf"], ["RHF needs a closed shell", "9 electrons with multiplicity 2"]),
        (["--multiplicity", "3"], ["9 electrons cannot have multiplicity 3", "even multiplicity"]),
        (["--multiplicity", "11"], ["multiplicity 11 needs 10 unpaired electrons", "only 9"]),
        (["--charge", "1"], ["8 electrons cannot have multiplicity 2"]),
    ],
)
def test_refusals_are_one_line(tmp_path, monkeypatch, args, fragments):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("the SCF ran"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))  # ours (--scf df)
    _one_error_line(CliRunner().invoke(main, ["run", str(OH), *args]), *fragments)
    assert list(tmp_path.iterdir()) == []


def test_frozen_core_beyond_the_beta_electrons_is_refused(monkeypatch):
    """B3+ as a triplet: two alpha electrons, no beta; its frozen 1s (one orbital per spin) has no
    beta orbital to freeze: refused before the SCF."""
    monkeypatch.setattr(pyscf_scf, "run_uhf", lambda *a, **k: pytest.fail("the SCF ran"))
    monkeypatch.setattr(driver, "run_scf", lambda *a, **k: pytest.fail("the SCF ran"))  # ours (--scf df)
    geom = parse_xyz("1\ncharge=3 multiplicity=3\nB 0 0 0\n", "b.xyz")
    with pytest.raises(InputError, match=r"frozen core \(1 orbitals per spin\) is more than the 0 occupied beta"):
        run(geom, RunOptions(frozen_core=True))


def test_time_mp2_stage_runs_ump2_as_run_does():
    """The benchmarks' stage timer takes a UHF reference: the same energies as ``dfmp2 run``."""
    from dfmp2.benchmarks.timing import time_mp2_stage
    from dfmp2.io.xyz import read_xyz

    mol = molecule.build_molecule(read_xyz(OH))
    auxmol = basis.make_auxmol(mol, basis.mp2_auxbasis(mol))
    ref = pyscf_scf.run_uhf(mol)
    seconds, e_os, e_ss, stages, _ran = time_mp2_stage(mol, auxmol, ref, RunOptions())
    r = run(OH, RunOptions(scf_mode="pyscf-df"))  # the same SCF as ``ref``: the same bits
    assert (e_os, e_ss) == (r.e_os, r.e_ss) and seconds > 0 and "pair" in stages
