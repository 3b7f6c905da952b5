"""Water / cc-pVDZ through the whole DF-MP2 pipeline on trn1 with the NKI kernels run on
this CPU (nki.simulate when AWS's nki package is installed, else the NumPy emulator),
against the fp64 CPU run: the fp32 Trainium path must stay within 1 µEh."""

import pytest

from dfmp2.interfaces.api import run
from dfmp2.kernels.nki import engines
from dfmp2.options import RunOptions

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_water_trn1_simulate_within_1uEh_of_fp64_cpu():
    ref = run("inputs/water.xyz", RunOptions(device="cpu"))
    got = run("inputs/water.xyz", RunOptions(device="trn1", simulate=True))
    e_ref, e_got = ref.e_os + ref.e_ss, got.e_os + got.e_ss
    assert abs(e_got - e_ref) < 1e-6, (e_got, e_ref)
    ran = got.ran
    expected = engines.NKI_SIMULATE if engines.real_nki()[0] is not None else engines.EMULATOR
    assert ran["device"] == "trn1" and ran["engine"] == expected
    kernels = ran["kernels"]
    for k in ("cholesky:host-fp64", "gemm:nki.gemm", "trsm:nki.trsm", "mp2_pair_energy:nki.mp2_pair"):
        assert k in kernels, kernels
    assert not any(k.split(":")[1].startswith("torch") for k in kernels), kernels
    # water compiles 24 kernel shapes. MP2: two GEMMs (the two transform halves), one TRSM, one pair
    # kernel. SCF (dfmp2.scf.jk): the JK factor in fixed groups of whole auxiliary shells, the same in
    # every rank count (dfmp2.scf.jk_dist.fit_groups: bitwise over ranks); water's groups have 4 sizes
    # (5 to 8 functions), each compiling J's second GEMM, the exchange GEMMs for the guess's and the
    # density changes' columns (padded: 8 and 16) and the SYRKs (5 nocc columns; 7 guess columns for
    # 3 of the sizes); J's first GEMM once. Before the fixed groups (one group) it was 10: a device
    # that compiles per shape pays for every group size
    assert ran["compiled_shapes"] == 24, ran["shapes"]
    assert abs(got.e_hf - ref.e_hf) < 1e-8, (got.e_hf, ref.e_hf)
    assert ran["simulated"] is True  # every simulated result says so


def test_cli_trn1_simulate_json_says_simulated(tmp_path):
    import json

    from click.testing import CliRunner

    from dfmp2.cli.main import main

    out = tmp_path / "w.json"
    res = CliRunner().invoke(main, ["run", "inputs/water.xyz", "--device", "trn1", "--simulate", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "simulated on this CPU" in res.output
    d = json.loads(out.read_text())
    assert d["ran"]["simulated"] is True and d["ran"]["precision"] == "fp32"
    assert d["ran"]["stage_precision"]["transform_fit"] == "fp32"


@pytest.mark.heavy
def test_oh_uhf_trn1_simulate_runs_our_dfuhf_on_the_nki_kernels():
    """OH (a degenerate pi shell, the case whose fp32 incremental SCF stalled at gradient 1.8e-8):
    our DF-UHF on trn1 with the J/K on the NKI kernels and G rebuilt once on the host in fp64
    (recorded): E(UHF) within 1e-8 Eh of CPU fp64 (measured 0 to 1e-13), <S^2> within 1e-8, E_corr
    within 1 µEh, cycles as on the CPU to a few."""
    cpu = run("inputs/open_shell/hydroxyl.xyz", RunOptions(device="cpu"))
    got = run("inputs/open_shell/hydroxyl.xyz", RunOptions(device="trn1", simulate=True))
    assert abs(got.e_hf - cpu.e_hf) < 1e-8, (got.e_hf, cpu.e_hf)
    assert abs(got.spin["s2"] - cpu.spin["s2"]) < 1e-8
    assert abs(got.e_corr - cpu.e_corr) < 1e-6
    s = got.ran["scf"]
    assert s["engine"] == "dfmp2.scf" and s["reference"] == "UHF" and s["device"] == "trn1"
    assert set(s["kernels"]) == {"gemm:nki.gemm", "syrk:nki.syrk"}, s["kernels"]
    assert s["kernels"]["syrk:nki.syrk"] >= 2 * (s["iterations"] - 1)  # K per spin each cycle
    assert "G rebuilt from the whole density with the fp64 factor, at cycle" in s["host"], s["host"]
    cp = s["cycle_precision"]
    assert cp["mode"] == "fp32" and cp["fp32_device"] == "trn1" and 1 <= cp["fp64_cycles"] <= 3
    assert cp["fp32_cycles"] + cp["fp64_cycles"] == s["iterations"] <= cpu.ran["scf"]["iterations"] + 5
    assert "scf_fp64_host" in s["times"] and got.ran["simulated"] is True
    for k in ("gemm:nki.gemm", "trsm:nki.trsm", "mp2_pair_energy:nki.mp2_pair"):
        assert k in got.ran["kernels"], got.ran["kernels"]
