"""Philox4x32-10 counter-based random numbers in PyTorch integer arithmetic.

Bit-exact with the Random123 known-answer vectors (Salmon et al., SC11) and identical on every
torch device by construction: every value is computed on the host (CPU) and then moved to the
requested ``device``, so a device receives the host's bits and does no arithmetic of its own.
(Running the same exactly specified ops on the GPU was tried and is not enough: on an H100 with
torch 2.11 CUDA's normals differed from the CPU's in the last bits. The host cost is negligible
for test and benchmark data.) Only integer ops (add, multiply of 16-bit halves, xor, shift, mask)
and correctly rounded float ops are used: no library RNG, no transcendental library calls, no
BLAS, so the host values do not depend on libm or the BLAS either.

Mapping from (seed, stream, offset) to Philox inputs
----------------------------------------------------
* ``seed``   (0 <= seed < 2**64)  -> key   = (seed & 0xffffffff, seed >> 32)
* ``stream`` (0 <= stream < 2**64) -> counter words c2, c3 = (stream & 0xffffffff, stream >> 32)
* ``offset`` counts uint32 *words* of the stream: word ``w`` is output word ``w % 4`` of the
  block with counter c0, c1 = (b & 0xffffffff, b >> 32), ``b = w // 4``.
  A draw of ``n`` words at ``offset`` is words offset .. offset + n - 1, so a long draw and
  the same draw split at any word boundary give the same bits.

Exact float mappings (every step exactly specified)
---------------------------------------------------
* fp32 uniform from one word x:  u = (2 * (x >> 9) + 1) * 2**-24      in [2**-24, 1 - 2**-24]
* fp64 uniform from two words (x0, x1), x0 first:
  u = (2 * ((x0 >> 6) * 2**26 + (x1 >> 6)) + 1) * 2**-53             in [2**-53, 1 - 2**-53]
  Both lie strictly inside (0, 1), so log(u) is finite.
* normals (any dtype): Box–Muller in fp64 from the fp64 uniforms of 4 words (u1, u2):
  z0 = r cos(2 pi u2), z1 = r sin(2 pi u2), r = sqrt(-2 log u1), rounded to the dtype at the end.
  log, sin and cos are evaluated here by range reduction (exact) and fixed polynomials using
  only +, -, *, / and sqrt on tensors, each a separate correctly rounded IEEE op (within ~1e-15
  relative of libm's values).
  One normal consumes 2 words; a draw of n normals consumes 4 * ceil(n / 2) words.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

M32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10

# Tensor/tensor division is always used instead of division by a Python scalar: torch's CUDA
# kernel replaces x / c by x * (1 / c), which would round differently from the CPU.


def _mulhilo(x: torch.Tensor, m: int):
    """(hi, lo) 32-bit words of the 64-bit product x * m; x int64 in [0, 2**32), m a uint32 constant.

    Split m into 16-bit halves so every intermediate stays below 2**49 (no int64 overflow).
    """
    m_lo, m_hi = m & 0xFFFF, m >> 16
    t = x * m_lo  # < 2**48
    u = x * m_hi  # < 2**48;  x*m = u*2**16 + t
    lo = (t + ((u & 0xFFFF) << 16)) & M32
    hi = (u + (t >> 16)) >> 16
    return hi, lo


def philox4x32(counter: torch.Tensor, key, rounds: int = ROUNDS) -> torch.Tensor:
    """Philox4x32-R block function.

    counter: int64 tensor (..., 4) with words in [0, 2**32).
    key: two ints (k0, k1) or an int64 tensor (..., 2) broadcastable against counter[..., :2].
    Returns int64 tensor (..., 4) of output words in [0, 2**32), on counter's device.
    """
    counter = counter.to(torch.int64)
    c0, c1, c2, c3 = counter.unbind(-1)
    if isinstance(key, torch.Tensor):
        k0, k1 = key.to(device=counter.device, dtype=torch.int64).unbind(-1)
    else:
        k0, k1 = int(key[0]) & M32, int(key[1]) & M32
    for r in range(rounds):
        if r:
            k0 = (k0 + PHILOX_W0) & M32
            k1 = (k1 + PHILOX_W1) & M32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def seed_to_key(seed: int) -> tuple[int, int]:
    """The Philox key for a 64-bit seed: (low word, high word)."""
    seed = int(seed)
    if not 0 <= seed < 2**64:
        raise ValueError(f"seed must be in [0, 2**64), got {seed}")
    return seed & M32, seed >> 32


def _check_index(name: str, v: int) -> int:
    v = int(v)
    if not 0 <= v < 2**62:
        raise ValueError(f"{name} must be in [0, 2**62), got {v}")
    return v


def random_bits(
    n: int, seed: int, offset: int = 0, *, stream: int = 0, device="cpu", dtype: torch.dtype = torch.int64
) -> torch.Tensor:
    """Words offset .. offset + n - 1 of the uint32 stream (seed, stream), as a 1-D tensor on
    ``device`` (computed on the host, then moved).

    dtype int64 (default, values in [0, 2**32)) or torch.uint32.
    """
    n, offset = _check_index("n", n), _check_index("offset", offset)
    k = seed_to_key(seed)
    stream = int(stream)
    if not 0 <= stream < 2**64:
        raise ValueError(f"stream must be in [0, 2**64), got {stream}")
    device = torch.device(device)
    if n == 0:
        return torch.empty(0, dtype=dtype, device=device)
    b0, b1 = offset // 4, (offset + n + 3) // 4
    blocks = torch.arange(b0, b1, dtype=torch.int64)
    ctr = torch.stack(
        (blocks & M32, blocks >> 32, torch.full_like(blocks, stream & M32), torch.full_like(blocks, stream >> 32)),
        dim=-1,
    )
    words = philox4x32(ctr, k).reshape(-1)
    s = offset - 4 * b0
    out = words[s : s + n]
    return _to(out if dtype == torch.int64 else out.to(dtype), device)


def _to(t: torch.Tensor, device) -> torch.Tensor:
    """A host result on ``device``: an exact copy, the only thing a device does here."""
    return t.to(torch.device(device))


def _shape(shape) -> tuple[int, ...]:
    if isinstance(shape, int):
        return (shape,)
    return tuple(int(s) for s in shape)


def words_for(kind: str, numel: int, dtype: torch.dtype = torch.float64) -> int:
    """How many uint32 words a draw of ``numel`` values consumes ('uniform' or 'normal')."""
    if kind == "uniform":
        return numel * (1 if dtype == torch.float32 else 2)
    if kind == "normal":
        return 4 * ((numel + 1) // 2)
    raise ValueError(f"kind must be 'uniform' or 'normal', got {kind!r}")


def _u64_from_words(w: torch.Tensor) -> torch.Tensor:
    """fp64 uniforms in (0, 1) from word pairs w[..., 0], w[..., 1] (exact mapping, see module doc)."""
    k = ((w[..., 0] >> 6) << 26) | (w[..., 1] >> 6)  # 52 random bits, < 2**52
    return (2 * k + 1).to(torch.float64) * 2.0**-53


def uniform(shape, seed: int, offset: int = 0, *, stream: int = 0, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Uniforms in the open interval (0, 1); fp32 uses 1 word per value, fp64 2 (see module doc).
    Computed on the host, then moved to ``device``."""
    shape = _shape(shape)
    n = math.prod(shape)
    if dtype == torch.float32:
        x = random_bits(n, seed, offset, stream=stream)
        return _to(((x >> 9) * 2 + 1).to(torch.float32).mul_(2.0**-24).reshape(shape), device)
    if dtype != torch.float64:
        raise ValueError(f"uniform supports float32 and float64, got {dtype}")
    x = random_bits(2 * n, seed, offset, stream=stream).reshape(n, 2)
    return _to(_u64_from_words(x).reshape(shape), device)


# ---- fp64 log, sin, cos from +, -, *, / only (deterministic on every device) ----------------
_LN2_HI = 6.93147180369123816490e-01  # fdlibm split of ln 2: hi has trailing zero bits,
_LN2_LO = 1.90821492927058770002e-10  # so e * _LN2_HI is exact for |e| < 2**11
_SQRT_HALF = 0.70710678118654752440
# log(m) = 2 atanh(s), s = (m - 1) / (m + 1), |s| <= 0.1716 for m in [sqrt(1/2), sqrt(2)):
# odd series coefficients 2/(2k+1); 12 terms leave a truncation error below 1e-19.
_ATANH_C = [2.0 / (2 * k + 1) for k in range(12)]
# Taylor coefficients of sin and cos on |x| <= pi/4; truncation below 1e-19.
_SIN_C = [(-1) ** k / math.factorial(2 * k + 1) for k in range(10)]
_COS_C = [(-1) ** k / math.factorial(2 * k) for k in range(10)]


def _horner(coeffs, x):
    p = torch.full_like(x, coeffs[-1])
    for c in reversed(coeffs[:-1]):
        p = p * x + c
    return p


def det_log(u: torch.Tensor) -> torch.Tensor:
    """Natural log of positive finite fp64 u, from exact range reduction and a polynomial.

    Within a few ulp of torch.log; the same bits wherever torch's elementwise ops are correctly
    rounded and not fused (the host's; philox evaluates it only there).
    """
    m, e = torch.frexp(u)  # u = m * 2**e, m in [0.5, 1): exact
    small = m < _SQRT_HALF
    m = torch.where(small, m * 2.0, m)  # m in [sqrt(1/2), sqrt(2)): exact
    e = (e - small.to(e.dtype)).to(torch.float64)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    logm = s * _horner(_ATANH_C, s2)
    return e * _LN2_HI + (e * _LN2_LO + logm)


def det_cos_sin_2pi(u: torch.Tensor):
    """(cos 2 pi u, sin 2 pi u) for fp64 u in [0, 1) given as multiples of 2**-53.

    Quadrant reduction is exact (4u and its rounding are exact); the remainder angle is within
    [-pi/4, pi/4] where fixed Taylor polynomials are used (evaluated on the host, as det_log).
    """
    t = u * 4.0
    q = torch.floor(t + 0.5)  # nearest quadrant; exact
    x = (t - q) * (math.pi / 2)  # |x| <= pi/4
    x2 = x * x
    s = x * _horner(_SIN_C, x2)
    c = _horner(_COS_C, x2)
    qi = q.to(torch.int64) & 3
    cos = torch.where(qi == 0, c, torch.where(qi == 1, -s, torch.where(qi == 2, -c, s)))
    sin = torch.where(qi == 0, s, torch.where(qi == 1, c, torch.where(qi == 2, -s, -c)))
    return cos, sin


def normal(shape, seed: int, offset: int = 0, *, stream: int = 0, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """Standard normals by Box–Muller in fp64 (see module doc), rounded to ``dtype`` at the end.
    Computed on the host, then moved to ``device``."""
    shape = _shape(shape)
    n = math.prod(shape)
    npair = (n + 1) // 2
    w = random_bits(4 * npair, seed, offset, stream=stream).reshape(npair, 2, 2)
    u1, u2 = _u64_from_words(w[:, 0]), _u64_from_words(w[:, 1])
    r = torch.sqrt(det_log(u1) * -2.0)
    c, s = det_cos_sin_2pi(u2)
    z = torch.stack((r * c, r * s), dim=-1).reshape(-1)[:n]
    return _to(z.reshape(shape).to(dtype), device)


@dataclass
class PhiloxStream:
    """Sequential draws from one (seed, stream): each draw starts where the previous ended.

    >>> g = PhiloxStream(seed=7); a = g.normal((3, 4)); b = g.uniform(5)
    is the same as normal((3, 4), 7, 0) and uniform(5, 7, offset=words_for('normal', 12)).
    """

    seed: int
    offset: int = 0
    stream: int = 0
    device: str | torch.device = "cpu"

    def bits(self, n: int, dtype=torch.int64) -> torch.Tensor:
        x = random_bits(n, self.seed, self.offset, stream=self.stream, device=self.device, dtype=dtype)
        self.offset += n
        return x

    def uniform(self, shape, dtype=torch.float64) -> torch.Tensor:
        x = uniform(shape, self.seed, self.offset, stream=self.stream, dtype=dtype, device=self.device)
        self.offset += words_for("uniform", x.numel(), dtype)
        return x

    def normal(self, shape, dtype=torch.float64) -> torch.Tensor:
        x = normal(shape, self.seed, self.offset, stream=self.stream, dtype=dtype, device=self.device)
        self.offset += words_for("normal", x.numel())
        return x
