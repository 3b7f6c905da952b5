"""Philox4x32-10: Random123 known answers, stream layout, exact float mappings, normals against an
independent Python Box–Muller, CPU == CUDA bits (values are computed on the host and moved)."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfmp2.linalg import philox
from dfmp2.linalg.philox import (
    PhiloxStream,
    det_cos_sin_2pi,
    det_log,
    normal,
    philox4x32,
    random_bits,
    uniform,
    words_for,
)

# Random123 tests/kat_vectors, "philox4x32 10" lines: counter, key, expected output.
KAT = [
    (
        (0x00000000, 0x00000000, 0x00000000, 0x00000000),
        (0x00000000, 0x00000000),
        (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8),
    ),
    (
        (0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF),
        (0xFFFFFFFF, 0xFFFFFFFF),
        (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD),
    ),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


def ref_philox(ctr, key, rounds=10):
    """Plain-Python Philox4x32 (arbitrary-precision ints), independent of the torch version."""
    M = 0xFFFFFFFF
    c = list(ctr)
    k0, k1 = key
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M, (k1 + 0xBB67AE85) & M
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M, (p0 >> 32) ^ c[3] ^ k1, p0 & M]
    return tuple(c)


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answer_vectors(ctr, key, expected):
    out = philox4x32(torch.tensor(ctr, dtype=torch.int64), key)
    assert tuple(out.tolist()) == expected
    assert ref_philox(ctr, key) == expected
    # key given as a tensor too
    out_t = philox4x32(torch.tensor(ctr, dtype=torch.int64), torch.tensor(key, dtype=torch.int64))
    assert tuple(out_t.tolist()) == expected


words32 = st.integers(0, 2**32 - 1)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(words32, words32, words32, words32), min_size=1, max_size=8), words32, words32)
def test_vectorised_matches_python_reference(ctrs, k0, k1):
    out = philox4x32(torch.tensor(ctrs, dtype=torch.int64), (k0, k1))
    assert [tuple(r) for r in out.tolist()] == [ref_philox(c, (k0, k1)) for c in ctrs]


def test_stream_layout_seed_stream_offset():
    seed, stream = 0x0123456789ABCDEF, 0xFEDCBA9876543210
    key = (seed & 0xFFFFFFFF, seed >> 32)
    bits = random_bits(13, seed, offset=6, stream=stream).tolist()
    expect = []
    for w in range(6, 19):
        b = w // 4
        blk = ref_philox((b & 0xFFFFFFFF, b >> 32, stream & 0xFFFFFFFF, stream >> 32), key)
        expect.append(blk[w % 4])
    assert bits == expect


def test_offsets_split_anywhere():
    full = random_bits(101, 42)
    parts = torch.cat([random_bits(n, 42, offset=o) for o, n in ((0, 3), (3, 1), (4, 50), (54, 47))])
    assert torch.equal(full, parts)
    g = PhiloxStream(seed=42)
    assert torch.equal(torch.cat([g.bits(7), g.bits(94)]), full)
    assert random_bits(0, 1).numel() == 0


def test_large_block_index_uses_high_counter_word():
    off = 4 * (2**32 + 5)
    w = random_bits(4, 9, offset=off).tolist()
    assert tuple(w) == ref_philox((5, 1, 0, 0), (9, 0))


def test_uint32_output_and_bad_arguments():
    x = random_bits(8, 1, dtype=torch.uint32)
    assert x.dtype == torch.uint32
    assert x.to(torch.int64).tolist() == random_bits(8, 1).tolist()
    with pytest.raises(ValueError):
        random_bits(4, -1)
    with pytest.raises(ValueError):
        random_bits(4, 2**64)
    with pytest.raises(ValueError):
        random_bits(4, 1, offset=-1)


def test_uniform_exact_mappings():
    x = random_bits(64, 5)
    u32 = uniform(64, 5, dtype=torch.float32)
    expect32 = [((v >> 9) * 2 + 1) * 2.0**-24 for v in x.tolist()]
    assert u32.dtype == torch.float32 and u32.tolist() == expect32
    u64 = uniform(32, 5)
    xs = x.tolist()
    expect64 = [(2 * (((xs[2 * i] >> 6) << 26) | (xs[2 * i + 1] >> 6)) + 1) * 2.0**-53 for i in range(32)]
    assert u64.dtype == torch.float64 and u64.tolist() == expect64


def test_uniform_open_interval_extremes():
    # the extreme words map strictly inside (0, 1) in both precisions
    lo, hi = torch.tensor([[0, 0]]), torch.tensor([[2**32 - 1, 2**32 - 1]])
    assert philox._u64_from_words(lo).item() == 2.0**-53
    assert philox._u64_from_words(hi).item() == 1 - 2.0**-53
    u = uniform((200, 50), 11, dtype=torch.float32)
    assert u.shape == (200, 50) and 0 < u.min() and u.max() < 1


def test_uniform_and_normal_statistics():
    u = uniform(200_000, 3)
    assert abs(u.mean().item() - 0.5) < 4 * math.sqrt(1 / 12 / 2e5)
    z = normal(200_001, 3)
    assert z.shape == (200_001,)
    assert abs(z.mean().item()) < 0.01 and abs(z.var().item() - 1) < 0.015
    from scipy import stats

    assert stats.kstest(z[:20_000].numpy(), "norm").pvalue > 1e-4


def test_normal_offsets_and_dtypes():
    z = normal(10, 8)
    assert torch.equal(normal(4, 8, offset=words_for("normal", 6)), z[6:])
    z32 = normal(10, 8, dtype=torch.float32)
    assert z32.dtype == torch.float32 and torch.equal(z32, z.to(torch.float32))
    g = PhiloxStream(8)
    a, b = g.normal(6), g.uniform(3)
    assert torch.equal(a, z[:6]) and torch.equal(b, uniform(3, 8, offset=12))


def test_deterministic_transcendentals_close_to_libm():
    x = torch.cat(
        [
            torch.logspace(-300, 300, 2001, dtype=torch.float64),
            1 + torch.linspace(-1e-6, 1e-6, 101, dtype=torch.float64),
            uniform(5000, 1),
        ]
    )
    ref = torch.log(x)
    ulp = torch.from_numpy(np.spacing(np.abs(ref.numpy())))
    err = (det_log(x) - ref).abs()
    assert (err <= 4 * ulp + 1e-300).all(), float((err / ulp).max())
    u = uniform(20_000, 2)
    c, s = det_cos_sin_2pi(u)
    assert (c - torch.cos(2 * math.pi * u)).abs().max() < 2e-15
    assert (s - torch.sin(2 * math.pi * u)).abs().max() < 2e-15
    assert ((c * c + s * s) - 1).abs().max() < 1e-15


def test_normals_match_python_box_muller_from_reference_words():
    """Known answers for the normals: Box–Muller in plain Python (libm's log, cos, sin) over the
    words of the plain-Python Philox above, at a seed, stream and odd offset."""
    seed, stream, offset, n = 0x0123456789ABCDEF, 5, 6, 101
    key = (seed & 0xFFFFFFFF, seed >> 32)

    def word(w):
        b = w // 4
        return ref_philox((b & 0xFFFFFFFF, b >> 32, stream, 0), key)[w % 4]

    def u64(x0, x1):
        return (2 * (((x0 >> 6) << 26) | (x1 >> 6)) + 1) * 2.0**-53

    expect = []
    for k in range((n + 1) // 2):
        w = [word(offset + 4 * k + j) for j in range(4)]
        u1, u2 = u64(w[0], w[1]), u64(w[2], w[3])
        r = math.sqrt(-2.0 * math.log(u1))
        expect += [r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)]
    got = normal(n, seed, offset, stream=stream)
    ref = torch.tensor(expect[:n], dtype=torch.float64)
    assert got.dtype == torch.float64 and got.shape == (n,)
    assert ((got - ref).abs() <= 4e-15 * ref.abs().clamp(min=1.0)).all(), float((got - ref).abs().max())


@pytest.mark.cuda
def test_cpu_and_cuda_bits_identical():
    for seed, off, n in ((0, 0, 1000), (2**63 + 12345, 7, 4099)):
        assert torch.equal(random_bits(n, seed, off, device="cuda").cpu(), random_bits(n, seed, off))
        for dt in (torch.float32, torch.float64):
            assert torch.equal(uniform(n, seed, off, dtype=dt, device="cuda").cpu(), uniform(n, seed, off, dtype=dt))
            # normals are computed on the host and copied, so they are bitwise equal too
            assert torch.equal(normal(n, seed, off, dtype=dt, device="cuda").cpu(), normal(n, seed, off, dtype=dt))
    from dfmp2.linalg.synthetic import random_matrix, synthetic_problem

    assert torch.equal(random_matrix((37, 29), 3, device="cuda").cpu(), random_matrix((37, 29), 3))
    for dt in (torch.float32, torch.float64):
        g, c = synthetic_problem(5, 33, 47, 9, dtype=dt, device="cuda"), synthetic_problem(5, 33, 47, 9, dtype=dt)
        assert g.B.device.type == "cuda" and torch.equal(g.B.cpu(), c.B)
        assert torch.equal(g.eps_occ.cpu(), c.eps_occ) and torch.equal(g.eps_vir.cpu(), c.eps_vir)
