"""Named DF-MP2 problem shapes and the size of each op's call at a shape.

A shape is (nbasis, nocc, nvir, naux) with nvir = nbasis - nocc (no frozen core, no linear
dependence). Each op is timed at the size of one call the DF-MP2 stage makes for that shape,
with the stage's own blocking (dfmp2.drivers.energy / dfmp2.memory), so per-op times add up to the
work of the stage rather than to arbitrary squares:

    gemm          (AUX_BLOCK nocc, nbasis) @ (nbasis, nvir): second half-transform of one
                  aux block, (Pi, nu) x C_vir -> (Pi, a)
    syrk          (nvir, naux): K_ii = B_i B_i^T, the i = j pair product
    trsm          L (naux, naux) solved against (naux, OCC_BLOCK nvir): the fit B = L^-1 (P|ia)
                  for the columns of one occupied block
    cholesky      (naux,): the fitting metric j2c = L L^T
    inv_sqrt_*    (naux,): j2c^-1/2 by eigh (the near-singular fallback) or Newton-Schulz
    mp2_pair_energy  one off-diagonal occupied block pair (OCC_BLOCK x OCC_BLOCK pairs,
                  as the MP2 stage's pair loop calls it), or all i >= j pairs when
                  nocc <= OCC_BLOCK (then the only call is the diagonal block)
    mp2_pair_energy_os  UMP2's opposite-spin block of the shape's doublet (alpha nocc, nvir;
                  beta nocc - 1, nvir + 1): alpha block x beta block, each up to OCC_BLOCK
"""

from __future__ import annotations

from dataclasses import dataclass

from dfmp2.errors import InputError, shown
from dfmp2.memory import OCC_BLOCK_MAX

AUX_BLOCK = 256
OCC_BLOCK = OCC_BLOCK_MAX

# name: (nbasis, nocc, naux). small/medium/large are the issue's; the rest are larger.
NAMED = {
    "small": (128, 16, 384),
    "medium": (512, 64, 1536),
    "large": (768, 96, 2304),
    "xlarge": (1024, 128, 3072),
    "h2o32": (768, 160, 2688),  # (H2O)32 / cc-pVDZ / cc-pVDZ-RI
    "xxlarge": (1536, 192, 4608),
}
DEFAULT_SHAPES = ("small", "medium", "large")


@dataclass(frozen=True)
class Shape:
    name: str
    nbasis: int
    nocc: int
    nvir: int
    naux: int

    def dims(self) -> dict:
        return {"nbasis": self.nbasis, "nocc": self.nocc, "nvir": self.nvir, "naux": self.naux}

    def label(self) -> str:
        return f"{self.name} ({self.nbasis}/{self.nocc}/{self.nvir}/{self.naux})"


def parse_shape(text: str) -> Shape:
    """'small', 'medium', ... or 'NOCC,NVIR,NAUX' (nbasis = nocc + nvir)."""
    t = text.strip().lower()
    if t in NAMED:
        nbasis, nocc, naux = NAMED[t]
        return Shape(t, nbasis, nocc, nbasis - nocc, naux)
    try:
        nocc, nvir, naux = (int(x) for x in t.replace("x", ",").split(","))
    except ValueError:
        raise InputError(
            f"--shapes: '{shown(text, 30)}' is neither a named shape ({', '.join(NAMED)}) "
            "nor NOCC,NVIR,NAUX (e.g. 16,112,384)"
        ) from None
    if min(nocc, nvir, naux) < 1:
        raise InputError(f"--shapes: sizes must be positive, got '{shown(text, 30)}'")
    return Shape(f"{nocc},{nvir},{naux}", nocc + nvir, nocc, nvir, naux)


def parse_shapes(text: str) -> list[Shape]:
    """Comma-separated names ('small,medium,large'); explicit NOCC,NVIR,NAUX shapes are
    separated from each other and from names by ';' ('small;32,200,800')."""
    shapes = []
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        tokens = [t.strip() for t in part.split(",") if t.strip()]
        if all(t.lower() in NAMED for t in tokens):
            shapes += [parse_shape(t) for t in tokens]
        else:
            shapes.append(parse_shape(part))
    if not shapes:
        raise InputError("--shapes: give at least one shape")
    return shapes


def op_sizes(s: Shape) -> dict:
    """{op: (argument sizes, description)} for one call of each op at shape ``s``."""
    X, o, v, N = s.naux, s.nocc, s.nvir, s.nbasis
    ab = min(X, AUX_BLOCK)
    ob = min(o, OCC_BLOCK)
    sizes = {
        "gemm": ((ab * o, N, v), f"(Pi, nu) x C_vir, one {ab}-function aux block"),
        "syrk": ((v, X), "K_ii = B_i B_i^T"),
        "trsm": ((X, ob * v), f"B = L^-1 (P, ia), columns of {ob} occupied"),
        "cholesky": ((X,), "metric j2c = L L^T"),
        "inv_sqrt_eigh": ((X,), "metric j2c^-1/2 (eigh)"),
        "inv_sqrt_newton_schulz": ((X,), "metric j2c^-1/2 (Newton-Schulz)"),
    }
    if o > ob:
        sizes["mp2_pair_energy"] = ((ob, ob, v, X), f"one {ob}x{ob} off-diagonal occupied block pair")
    else:
        sizes["mp2_pair_energy"] = ((o, v, X), f"all {o * (o + 1) // 2} pairs i >= j")
    obb = max(1, min(o - 1, OCC_BLOCK))
    sizes["mp2_pair_energy_os"] = ((ob, obb, v, v + 1, X), f"UMP2 alpha x beta block ({ob}x{obb}) of the doublet")
    return sizes
