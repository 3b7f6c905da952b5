"""The trn1/trn2 backend (linalg/neuron.py): engine selection, refusal without the SDK,
records, shape buckets, and every op against the torch backend through the NumPy emulator.

fp32 expectations as in tests/kernels/test_nki_kernels.py (u = 2^-24); the ops add only exact host
layout changes (transposes, reversal, zero/identity padding) and fp64 host work.
"""

import math

import pytest
import torch

from dfmp2 import linalg
from dfmp2.errors import error_line
from dfmp2.kernels.nki import engines
from dfmp2.linalg import DeviceUnavailableError, torch_ops
from dfmp2.linalg.neuron import NeuronBackend, bucket, make_neuron_backend
from dfmp2.linalg.synthetic import random_matrix, random_spd, synthetic_problem

U = 2.0**-24


@pytest.fixture(autouse=True)
def _one_torch_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # see tests/kernels/test_nki_kernels.py
    yield
    torch.set_num_threads(n)


@pytest.fixture
def be():
    return make_neuron_backend("trn1", simulate=True, engine=engines.EMULATOR)


def rel(x, ref):
    x, ref = torch.as_tensor(x).double(), torch.as_tensor(ref).double()
    return float((x - ref).abs().max() / ref.abs().max())


def m32(shape, seed):
    return random_matrix(shape, seed, dtype=torch.float32)


# ---- engine selection: explicit, reported, never a silent fallback ----


def _hardware_here():
    return engines.real_nki()[0] is not None and bool(engines.neuron_devices())


@pytest.mark.skipif(_hardware_here(), reason="a Neuron device and SDK are present")
@pytest.mark.parametrize("name", ["trn1", "trn2"])
def test_trn_without_sdk_is_one_clear_line(name):
    with pytest.raises(DeviceUnavailableError) as e:
        linalg.get_backend(name)
    msg = str(e.value)
    assert "\n" not in msg and name in msg
    assert "neuronx-cc nki" in msg and "pip.repos.neuron.amazonaws.com" in msg
    assert "--simulate" not in msg and "--device" not in msg
    assert e.value.alternatives == ("simulate", "cpu")  # the library names no CLI option...
    assert "--simulate" in error_line(e.value) and "--device cpu" in error_line(e.value)  # ...the CLI does


def test_simulate_picks_nki_simulate_or_the_emulator_and_says_which():
    b = linalg.get_backend("trn2", simulate=True)
    expected = engines.NKI_SIMULATE if engines.real_nki()[0] is not None else engines.EMULATOR
    assert isinstance(b, NeuronBackend) and b.engine == expected
    d = b.describe()
    assert d["device"] == "trn2" and d["engine"] == expected and d["target"] == "trn2"


def test_explicit_engines_are_honoured_or_refused():
    assert make_neuron_backend("trn1", simulate=True, engine=engines.EMULATOR).engine == engines.EMULATOR
    with pytest.raises(ValueError, match="contradicts"):
        make_neuron_backend("trn1", simulate=True, engine=engines.HARDWARE)
    with pytest.raises(ValueError, match="contradicts"):
        make_neuron_backend("trn1", simulate=False, engine=engines.EMULATOR)
    with pytest.raises(ValueError, match="unknown Trainium device"):
        make_neuron_backend("trn3", simulate=True)
    if engines.real_nki()[0] is None:
        with pytest.raises(DeviceUnavailableError, match="nki"):
            make_neuron_backend("trn1", simulate=True, engine=engines.NKI_SIMULATE)


class _FakeNki:
    """Stands in for AWS's nki package to test the hardware plumbing: its jit runs the
    kernel on the emulator and remembers the target it was called under."""

    def __init__(self):
        self.targets = []

    def jit(self, kernel):
        import os

        from dfmp2.kernels.nki_emulator import simulate

        def call(*args, **kw):
            self.targets.append(os.environ.get("NEURON_PLATFORM_TARGET_OVERRIDE"))
            return simulate(kernel)(*args, **kw)

        return call

    def simulate(self, kernel):
        raise AssertionError("hardware must not use nki.simulate")


def test_hardware_engine_refuses_kernels_bound_to_the_emulator(monkeypatch):
    if engines.real_nki()[0] is not None:
        pytest.skip("AWS's nki package is installed: the kernels are bound to it")
    monkeypatch.setattr(engines, "real_nki", lambda: (_FakeNki(), None))
    monkeypatch.setattr(engines, "neuron_devices", lambda: ["/dev/neuron0"])
    with pytest.raises(RuntimeError, match="refusing"):
        linalg.get_backend("trn1")


def test_hardware_engine_runs_nki_jit_and_never_the_emulator(monkeypatch):
    fake = _FakeNki()
    monkeypatch.setattr(engines, "real_nki", lambda: (fake, None))
    monkeypatch.setattr(engines, "neuron_devices", lambda: ["/dev/neuron0"])
    from dfmp2.kernels.nki import lang

    monkeypatch.setattr(lang, "REAL_NKI", True)
    monkeypatch.delenv("NEURON_PLATFORM_TARGET_OVERRIDE", raising=False)
    b = linalg.get_backend("trn2")
    assert b.engine == engines.HARDWARE
    a = m32((40, 30), 1)
    assert rel(b.gemm(a, a, trans_b=True), a.double() @ a.double().T) < 1e-6
    assert fake.targets == ["trn2"]
    import os

    assert "NEURON_PLATFORM_TARGET_OVERRIDE" not in os.environ  # restored after the call
    monkeypatch.setattr(engines, "neuron_devices", lambda: [])
    with pytest.raises(DeviceUnavailableError, match="/dev/neuron"):
        linalg.get_backend("trn1")


# ---- buckets ----


def test_buckets_bound_padding_and_shape_count():
    prev = 0
    for n in range(1, 5000):
        b = bucket(n)
        assert b >= n and b >= prev
        if n > 128:
            assert b % 128 == 0  # whole 128-row tiles
        if 128 < n <= 1024:
            assert b - n < 128
        if n > 1024:
            assert (b - n) / n < 0.25  # four buckets per octave
        prev = b
    # 8, 16, 32, 64, 128 | 256 .. 1024 | 1280 .. 2048 | 2560 .. 4096
    assert len({bucket(n) for n in range(1, 4097)}) == 5 + 7 + 4 + 4


def test_compiled_shapes_are_bounded_by_buckets(be):
    b = m32((24, 5), 2)
    for m in range(200, 1000, 37):  # 22 distinct row counts
        be.gemm(m32((m, 24), 3)[:m], b)
    d = be.describe()
    assert d["launches"]["gemm_kernel"] == 22
    assert d["compiled_shapes"] == len({bucket(m) for m in range(200, 1000, 37)}) == 7


# ---- ops against the torch backend ----


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
def test_gemm(be, trans_a, trans_b):
    a, b = m32((130, 70), 4), m32((70, 600), 5)
    A = a.T.contiguous() if trans_a else a
    B = b.T.contiguous() if trans_b else b
    c = be.gemm(A, B, trans_a=trans_a, trans_b=trans_b, alpha=0.5)
    assert c.dtype == torch.float32 and c.shape == (130, 600)
    assert rel(c, 0.5 * a.double() @ b.double()) < 4 * math.sqrt(70) * U
    assert be.kernels_used == {"gemm:nki.gemm": 1}


def test_gemm_out_beta_and_batches(be):
    a, b = m32((3, 20, 9), 6), m32((9, 11), 7)
    out = m32((3, 20, 11), 8)
    ref = 2.0 * (a.double() @ b.double()) + 0.25 * out.double()
    r = be.gemm(a, b, alpha=2.0, beta=0.25, out=out)
    assert r is out and rel(out, ref) < 1e-6
    x, y = m32((2, 5, 7), 9), m32((2, 7, 3), 10)  # broadcast batch: one launch each
    assert rel(be.gemm(x, y), x.double() @ y.double()) < 1e-6
    assert be.describe()["launches"]["gemm_kernel"] == 3


@pytest.mark.parametrize(
    "trans,uplo,full", [(False, "lower", True), (True, "lower", False), (False, "upper", False), (True, "upper", True)]
)
def test_syrk(be, trans, uplo, full):
    a = m32((260, 45), 11)
    A = a.T.contiguous() if trans else a
    c = be.syrk(A, trans=trans, alpha=3.0, uplo=uplo, full=full)
    ref = 3.0 * a.double() @ a.double().T
    if not full:
        ref = torch.tril(ref) if uplo == "lower" else torch.triu(ref)
    assert rel(c, ref) < 4 * math.sqrt(45) * U


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("uplo", ["lower", "upper"])
@pytest.mark.parametrize("trans", [False, True])
def test_trsm_all_cases(be, side, uplo, trans):
    n, m = 150, 37
    L = torch_ops.cholesky(random_spd(n, 1e4, seed=12)).float()
    A = L if uplo == "lower" else L.T.contiguous()
    B = m32((n, m), 13) if side == "left" else m32((m, n), 13)
    x = be.trsm(A, B, side=side, uplo=uplo, trans=trans)
    ref = torch_ops.trsm(A.double(), B.double(), side=side, uplo=uplo, trans=trans)
    assert rel(x, ref) < 4 * math.sqrt(n) * U * float(torch.linalg.cond(L.double()))


def test_trsm_unit_diagonal_vector_rhs_and_diag_inverse_cache(be):
    n = 140
    L = torch_ops.cholesky(random_spd(n, 1e3, seed=14)).float()
    b = m32((n,), 15)
    x = be.trsm(L, b, unit_diagonal=True)
    ref = torch_ops.trsm(L.double(), b.double()[:, None], unit_diagonal=True)[:, 0]
    assert x.shape == (n,) and rel(x, ref) < 1e-4
    for _ in range(3):  # same metric: inverses prepared once
        be.trsm(L, m32((n, 4), 16))
    assert be.kernels_used["trsm_diag_inverse:host-fp64"] == 2  # unit-diagonal L is another matrix
    assert be.kernels_used["trsm:nki.trsm"] == 4


def test_cholesky_on_host_fp64_is_recorded(be):
    a = random_spd(50, 1e3, seed=17)
    L = be.cholesky(a)
    assert L.dtype == torch.float64 and rel(L, torch_ops.cholesky(a)) < 1e-14
    assert be.kernels_used == {"cholesky:host-fp64": 1}


def test_inv_sqrt_eigh_host_and_newton_schulz_on_the_gemm_kernel(be):
    a = random_spd(100, 1e3, seed=18)
    x_ref, _ = torch_ops.inv_sqrt_eigh(a)
    x, info = be.inv_sqrt_spd(a, method="eigh")
    assert info["where"] == "host-fp64" and rel(x, x_ref) < 1e-12
    xs, info = be.inv_sqrt_spd(a.float(), method="newton_schulz")
    assert info["converged"] and info["kernel"] == "nki.gemm" and xs.dtype == torch.float32
    assert rel(xs, x_ref) < 10 * 1e3 * U  # ~cond(A) u; measured below 1e-5
    assert be.kernels_used["gemm:nki.gemm"] >= 3 * info["iterations"]
    assert be.kernels_used["inv_sqrt_spd:newton_schulz(nki.gemm)"] == 1


@pytest.mark.parametrize("symmetric", [True, False])
def test_mp2_pair_energy_matches_torch(be, symmetric):
    p = synthetic_problem(7, 45, 150, seed=19, dtype=torch.float32)
    I, J = (slice(0, 7), slice(0, 7)) if symmetric else (slice(0, 4), slice(4, 7))
    got = be.mp2_pair_energy(p.B[I], p.B[J], p.eps_occ[I], p.eps_occ[J], p.eps_vir, symmetric=symmetric)
    ref = torch_ops.mp2_pair_energy(
        p.B[I].double(), p.B[J].double(), p.eps_occ[I], p.eps_occ[J], p.eps_vir, symmetric=symmetric
    )
    tol = 4 * math.sqrt(150) * U * abs(ref[0])
    assert abs(got[0] - ref[0]) <= tol and abs(got[1] - ref[1]) <= tol
    assert be.kernels_used == {"mp2_pair_energy:nki.mp2_pair": 1}


def test_mp2_pair_energy_splits_large_blocks(be, monkeypatch):
    p = synthetic_problem(9, 20, 60, seed=20, dtype=torch.float32)
    ref = torch_ops.mp2_pair_energy(p.B.double(), p.B.double(), p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    whole = be.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    monkeypatch.setattr(be, "_occ_block_cap", lambda naux, nvir: 4)  # 9 = 4 + 4 + 1
    split = be.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    for e in (whole, split):
        assert abs(e[0] - ref[0]) <= 1e-6 * abs(ref[0]) and abs(e[1] - ref[1]) <= 1e-6 * abs(ref[0])
    assert be.kernels_used["mp2_pair_energy:nki.mp2_pair"] == 1 + 6  # 3 x 4 / 2 sub-block pairs


def test_pair_kernel_too_big_for_sbuf_is_a_clear_error(be):
    with pytest.raises(ValueError, match="do not fit"):
        be._occ_block_cap(naux=128 * 40, nvir=1000)


@pytest.mark.nki_sim
def test_backend_on_aws_nki_simulate():
    b = make_neuron_backend("trn2", simulate=True, engine=engines.NKI_SIMULATE)
    assert b.engine == engines.NKI_SIMULATE
    a = m32((150, 40), 21)
    assert rel(b.gemm(a, a, trans_b=True), a.double() @ a.double().T) < 4 * math.sqrt(40) * U
    L = torch_ops.cholesky(random_spd(140, 1e3, seed=22)).float()
    B = m32((140, 9), 23)
    assert rel(b.trsm(L, B), torch_ops.trsm(L.double(), B.double())) < 1e-4
    p = synthetic_problem(5, 19, 84, seed=24, dtype=torch.float32)
    got = b.mp2_pair_energy(p.B, p.B, p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    ref = torch_ops.mp2_pair_energy(p.B.double(), p.B.double(), p.eps_occ, p.eps_occ, p.eps_vir, symmetric=True)
    assert abs(got[0] - ref[0]) <= 1e-6 * abs(ref[0]) and abs(got[1] - ref[1]) <= 1e-6 * abs(ref[0])
