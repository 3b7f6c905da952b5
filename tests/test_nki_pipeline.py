"""Water / cc-pVDZ through the whole DF-MP2 pipeline on trn1 with the NKI kernels run on
this CPU (nki.simulate when AWS's nki package is installed, else the NumPy emulator),
against the fp64 CPU run: the fp32 Trainium path must stay within 1 µEh."""
import pytest

from dfmp2.pipeline import RunOptions, run
from dfmp2.kernels.nki import engines


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
    # water compiles 10 kernel shapes. MP2: two GEMMs (the two transform halves), one TRSM, one pair
    # kernel; SCF (dfmp2.dfhf): J's two GEMMs, the exchange GEMM for the guess's 7 orbitals and for
    # the density changes (padded rows: 8 and 16), SYRKs of 5 (nocc) and 7 (guess rank) columns per P
    assert ran["compiled_shapes"] == 10, ran["shapes"]
    assert abs(got.e_hf - ref.e_hf) < 1e-8, (got.e_hf, ref.e_hf)
    assert ran["simulated"] is True   # every simulated result says so


def test_cli_trn1_simulate_json_says_simulated(tmp_path):
    import json
    from click.testing import CliRunner
    from dfmp2.cli import main
    out = tmp_path / "w.json"
    res = CliRunner().invoke(main, ["run", "inputs/water.xyz", "--device", "trn1", "--simulate",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "simulated on this CPU" in res.output
    d = json.loads(out.read_text())
    assert d["ran"]["simulated"] is True and d["ran"]["precision"] == "fp32"
    assert d["ran"]["stage_precision"]["transform_fit"] == "fp32"
