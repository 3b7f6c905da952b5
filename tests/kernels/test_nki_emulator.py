"""The NumPy execution of NKI (kernels/nki_emulator): every enforced limit raises.

Each test runs a tiny kernel written against ``nl``/``nisa`` through the emulator. The
limits are those of kernels/nki_emulator/limits.py (NKI docs: tiling overview, nc_matmul,
Trainium/Trainium2 architecture guides).
"""

import numpy as np
import pytest

from dfmp2.kernels.nki.lang import nisa, nl
from dfmp2.kernels.nki_emulator import (
    HardwareLimitError,
    NkiEmulatorError,
    UnsupportedError,
    bind,
    limits_for,
    simulate,
)
from dfmp2.kernels.nki_emulator import isa as emu_isa
from dfmp2.kernels.nki_emulator import language as emu_language

F32 = np.float32


def _x(p=128, f=4):
    return np.arange(p * f, dtype=F32).reshape(p, f)


# ---- kernels used by the tests (plain functions over nl / nisa, like the real ones) ----


def k_alloc(x, p, f, buffer_name):
    nl.ndarray((p, f), dtype=nl.float32, buffer=getattr(nl, buffer_name))  # the allocation under test
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    return out


def k_matmul(x, k, m, n, accumulate):
    a = nl.ndarray((k, m), dtype=nl.float32, buffer=nl.sbuf)
    b = nl.ndarray((k, n), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=b, value=2.0)
    acc = nl.ndarray((min(m, 128), min(n, 512)), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=accumulate)
    res = nl.ndarray((m, min(n, 512)), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)
    out = nl.ndarray((m, min(n, 512)), dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=res)
    return out


def k_psum_banks(x, ntiles):
    tiles = []
    for _ in range(ntiles):
        tiles.append(nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum))
    return nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)


def k_sbuf_fill(x, kib):
    tiles = []
    for _ in range(kib):
        tiles.append(nl.ndarray((128, 256), dtype=nl.float32, buffer=nl.sbuf))  # 1 KiB per partition
    return nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)


def k_copy(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    u = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=u, data=t, op0=nl.multiply, operand0=2.0, op1=nl.add, operand1=1.0)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=u)
    return out


def k_uninit_read(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    out = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)
    nisa.dma_copy(dst=out, src=t)
    return out


def k_dma_to_psum(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.psum)
    nisa.dma_copy(dst=t, src=x)
    return x


def k_matmul_psum_operand(x):
    a = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    b = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=b, value=1.0)
    acc = nl.ndarray((128, 128), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(dst=acc, stationary=a, moving=b)
    return x


def k_both_psum(x):
    a = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    b = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.psum)
    nisa.memset(dst=a, value=1.0)
    nisa.memset(dst=b, value=1.0)
    c = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=c, data1=a, data2=b, op=nl.add)
    return x


def k_start_partition(x):
    t = nl.ndarray((128, 4), dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t[1:65, :], value=0.0)
    return x


def k_high_level_add(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=x)
    return nl.add(t, t)


def k_write_input(x):
    t = nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=0.0)
    nisa.dma_copy(dst=x, src=t)
    return x


def run(kernel, *args, target="trn1", **kw):
    return simulate(kernel, target=target)(*args, **kw)


# ---- hardware limits ----


def test_129_partitions_raise():
    with pytest.raises(HardwareLimitError, match=r"129.*128 partitions"):
        run(k_alloc, _x(), 129, 4, "sbuf")
    with pytest.raises(HardwareLimitError, match="129"):
        run(k_alloc, _x(), 129, 4, "psum")
    run(k_alloc, _x(), 128, 4, "sbuf")  # the limit itself is fine


def test_matmul_contraction_partitions_limit():
    with pytest.raises(HardwareLimitError, match="129"):
        run(k_matmul, _x(), 129, 8, 8, False)


def test_513_wide_moving_tile_raises():
    with pytest.raises(HardwareLimitError, match="moving free size 513 exceeds gemm_moving_fmax = 512"):
        run(k_matmul, _x(), 128, 128, 513, False)
    out = run(k_matmul, _x(), 128, 128, 512, False)  # 512 is allowed
    np.testing.assert_array_equal(out, np.full((128, 512), 256.0, F32))


def test_129_wide_stationary_tile_raises():
    with pytest.raises(HardwareLimitError, match="stationary free size 129 exceeds"):
        run(k_matmul, _x(), 128, 129, 64, False)


def test_psum_over_full_raises():
    run(k_psum_banks, _x(), 8)  # 8 banks of 2 KiB: the whole PSUM
    with pytest.raises(HardwareLimitError, match=r"PSUM over-full.*8 banks"):
        run(k_psum_banks, _x(), 9)


def test_psum_tile_wider_than_a_bank_raises():
    with pytest.raises(HardwareLimitError, match="PSUM bank"):
        run(k_alloc, _x(), 128, 513, "psum")


def test_sbuf_capacity_per_target():
    assert limits_for("trn1").sbuf_partition_bytes == 192 * 1024
    assert limits_for("trn2").sbuf_partition_bytes == 224 * 1024
    run(k_sbuf_fill, _x(), 192, target="trn1")
    with pytest.raises(HardwareLimitError, match="SBUF over-full on trn1"):
        run(k_sbuf_fill, _x(), 193, target="trn1")
    run(k_sbuf_fill, _x(), 224, target="trn2")
    with pytest.raises(HardwareLimitError, match="SBUF over-full on trn2"):
        run(k_sbuf_fill, _x(), 225, target="trn2")


def test_released_tiles_free_their_memory():
    # 9 PSUM tiles one after another (each dropped before the next) never exceed 8 banks.
    def k_sequential_psum(x):
        for _ in range(9):
            t = nl.ndarray((128, 512), dtype=nl.float32, buffer=nl.psum)
            del t
        return nl.ndarray(x.shape, dtype=nl.float32, buffer=nl.shared_hbm)

    run(k_sequential_psum, _x())


# ---- memory types, initialisation, subset ----


def test_matmul_operands_must_be_in_sbuf():
    with pytest.raises(NkiEmulatorError, match="must be in SBUF"):
        run(k_matmul_psum_operand, _x())


def test_dma_cannot_target_psum():
    with pytest.raises(NkiEmulatorError, match="PSUM"):
        run(k_dma_to_psum, _x())


def test_tensor_tensor_inputs_not_both_psum():
    with pytest.raises(NkiEmulatorError, match="both be in PSUM"):
        run(k_both_psum, _x())


def test_uninitialised_read_raises():
    with pytest.raises(NkiEmulatorError, match="uninitialised"):
        run(k_uninit_read, _x())


def test_accumulate_on_fresh_psum_raises():
    with pytest.raises(NkiEmulatorError, match="accumulate=True"):
        run(k_matmul, _x(), 128, 8, 8, True)


def test_start_partition_rule():
    with pytest.raises(HardwareLimitError, match="start partition"):
        run(k_start_partition, _x())


def test_outside_subset_raises():
    with pytest.raises(UnsupportedError, match="outside the emulator subset"):
        run(k_high_level_add, _x())


def test_inputs_are_read_only():
    with pytest.raises(NkiEmulatorError, match="kernel input"):
        run(k_write_input, _x())


def test_elementwise_result_and_stats():
    f = simulate(k_copy)
    x = _x(100, 7)
    np.testing.assert_array_equal(f(x), 2 * x + 1)
    assert f.last_stats["instructions"] == {"dma_copy": 2, "tensor_scalar": 1}


def test_calls_outside_a_launch_raise():
    with pytest.raises(NkiEmulatorError, match="outside a kernel launch"):
        emu_language.ndarray((4, 4), emu_language.float32, emu_language.sbuf)


def test_bind_uses_the_emulator_whatever_the_module_imported():
    g = bind(k_copy).__globals__
    assert g["nl"] is emu_language and g["nisa"] is emu_isa
