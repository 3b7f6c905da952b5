"""The Triton pair-energy kernels on CPU tensors under Triton's interpreter (TRITON_INTERPRET=1;
``@interpreted`` runs them in a child process unless this one already interprets, see
tests/helpers/triton_interpreter.py), against linalg.reference (the unfused einsum).

Accuracy asserted: fp64 within 64 ulp-scale of the fp64 reference (|dE| <= 1e-14 |E_OS|; the
observed differences are a few 1e-17 Eh), fp32 within 1e-6 relative of the same computation with
an fp32 GEMM (observed ~1e-8).
"""

import math

import pytest
import torch
from triton_interpreter import interpreted

from dfmp2.linalg import torch_ops
from dfmp2.linalg.reference import mp2_pair_energy_reference
from dfmp2.linalg.synthetic import synthetic_problem


def pipeline_layout(B):
    """The pipeline's B: a (nocc, nvir, naux) view of a contiguous Bt (naux, nocc*nvir)."""
    nocc, nvir, naux = B.shape
    Bt = B.permute(2, 0, 1).reshape(naux, nocc * nvir).contiguous()
    return Bt.view(naux, nocc, nvir).permute(1, 2, 0)


def _problem(nocc, nvir, naux, seed=7):
    p = synthetic_problem(nocc, nvir, naux, seed)
    return p.B, p.eps_occ, p.eps_vir


def _close64(got, ref):
    scale = abs(ref[0])
    assert abs(got[0] - ref[0]) <= 1e-14 * scale, (got, ref)
    assert abs(got[1] - ref[1]) <= 1e-14 * scale, (got, ref)


def _close32(got, ref):
    for g, r in zip(got, ref):
        assert abs(g - r) <= 1e-6 * abs(r), (got, ref)


# (nocc, nvir, naux, config): one partial tile; a full diagonal + a ragged off-diagonal tile;
# many ragged tiles and aux chunks with small blocks.
CASES = [(3, 20, 37, None), (3, 70, 50, None), (4, 37, 45, {"BLOCK": 16, "BLOCK_P": 16})]


@interpreted
@pytest.mark.parametrize("nocc,nvir,naux,config", CASES)
@pytest.mark.parametrize("layout", ["contiguous", "pipeline"])
def test_fused_fp64_equals_torch(nocc, nvir, naux, config, layout):
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    B, eo, ev = _problem(nocc, nvir, naux)
    if layout == "pipeline":
        B = pipeline_layout(B)
    for sym in (True, False):
        ref = mp2_pair_energy_reference(B, B, eo, eo, ev)
        got = fused_pair_energy(B, B, eo, eo, ev, symmetric=sym, config=config)
        _close64(got, ref)
        _close64(got, torch_ops.mp2_pair_energy(B, B, eo, eo, ev, symmetric=sym))


@interpreted
def test_fused_off_diagonal_blocks_fp64():
    """Bi and Bj different blocks of one B (ni != nj), as the pipeline's I > J blocks."""
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    B, eo, ev = _problem(7, 33, 40)
    B = pipeline_layout(B)
    args = (B[4:7], B[0:2], eo[4:7], eo[0:2], ev)
    _close64(fused_pair_energy(*args, config={"BLOCK": 16, "BLOCK_P": 16}), mp2_pair_energy_reference(*args))


@interpreted
@pytest.mark.parametrize("nocc,nvir,naux,config", CASES[1:])
def test_fused_fp32_equals_torch(nocc, nvir, naux, config):
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    B, eo, ev = _problem(nocc, nvir, naux)
    B32 = pipeline_layout(B).to(torch.float32)
    ref32 = mp2_pair_energy_reference(B32, B32, eo, eo, ev, k_dtype=torch.float32)
    got = fused_pair_energy(B32, B32, eo, eo, ev, symmetric=True, config=config)
    _close32(got, ref32)
    ref64 = mp2_pair_energy_reference(B, B, eo, eo, ev)
    assert abs(sum(got) - sum(ref64)) <= 1e-6 * abs(sum(ref64))


@interpreted
def test_fused_bit_identical_run_to_run():
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    B, eo, ev = _problem(3, 40, 30)
    runs = {
        tuple(float.hex(e) for e in fused_pair_energy(B, B, eo, eo, ev, symmetric=True, config={"BLOCK": 16}))
        for _ in range(2)
    }
    assert len(runs) == 1


def _random_shapes(n=6, seed=2024):
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=g))
    return [(r(1, 3), r(1, 3), r(1, 40), r(1, 40), (16, 32)[r(0, 1)], r(0, 2**31)) for _ in range(n)]


@interpreted
@pytest.mark.parametrize("ni,nj,nvir,naux,block,seed", _random_shapes())
def test_fused_random_shapes(ni, nj, nvir, naux, block, seed):
    """Random sizes (1..40, ragged against every tile), Bi != Bj, normal B, random energies."""
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    g = torch.Generator().manual_seed(seed)
    Bi = torch.randn(ni, nvir, naux, dtype=torch.float64, generator=g)
    Bj = torch.randn(nj, nvir, naux, dtype=torch.float64, generator=g)
    ei = -1.0 - torch.rand(ni, dtype=torch.float64, generator=g)
    ej = -1.0 - torch.rand(nj, dtype=torch.float64, generator=g)
    ev = 0.5 + torch.rand(nvir, dtype=torch.float64, generator=g)
    got = fused_pair_energy(Bi, Bj, ei, ej, ev, config={"BLOCK": block, "BLOCK_P": 16})
    ref = mp2_pair_energy_reference(Bi, Bj, ei, ej, ev)
    scale = sum(abs(x) for x in ref) + 1e-300
    assert all(math.isfinite(x) for x in got)
    assert abs(got[0] - ref[0]) <= 1e-13 * scale and abs(got[1] - ref[1]) <= 1e-13 * scale


@interpreted
def test_epilogue_equals_torch():
    from dfmp2.kernels.triton.pair_energy_epilogue import gemm_epilogue_pair_energy

    B, eo, ev = _problem(5, 37, 30)
    B = pipeline_layout(B)
    for sym in (True, False):
        ref = mp2_pair_energy_reference(B, B, eo, eo, ev)
        for max_elems in (1 << 26, 2 * 37 * 37 * 5):  # one GEMM, or row chunks of 2 orbitals
            _close64(gemm_epilogue_pair_energy(B, B, eo, eo, ev, symmetric=sym, block=16, max_elems=max_elems), ref)
    args = (B[3:5], B[0:3], eo[3:5], eo[0:3], ev)
    _close64(gemm_epilogue_pair_energy(*args, block=16), mp2_pair_energy_reference(*args))
    B32 = B.to(torch.float32)
    _close32(
        gemm_epilogue_pair_energy(B32, B32, eo, eo, ev, symmetric=True, block=16),
        mp2_pair_energy_reference(B32, B32, eo, eo, ev, k_dtype=torch.float32),
    )


def _opposite_spin_problem(ni=3, nj=2, nvir=37, nvir_j=45, naux=41, seed=5):
    """Alpha and beta blocks of different occupied and virtual counts (UMP2's alpha-beta block)."""
    g = torch.Generator().manual_seed(seed)
    Bi = torch.randn(ni, nvir, naux, generator=g, dtype=torch.float64) * 0.1
    Bj = torch.randn(nj, nvir_j, naux, generator=g, dtype=torch.float64) * 0.1
    ei, ej = (
        -1 - torch.rand(ni, generator=g, dtype=torch.float64),
        -1 - torch.rand(nj, generator=g, dtype=torch.float64),
    )
    ev, evj = torch.rand(nvir, generator=g, dtype=torch.float64), torch.rand(nvir_j, generator=g, dtype=torch.float64)
    return Bi, Bj, ei, ej, ev, evj


@interpreted
def test_epilogue_opposite_spin_equals_reference():
    """The RECT form (rectangular K, b over j's own virtuals, e_os only) against the einsum, fp64
    and fp32, with ragged tiles both ways and in the pipeline's layout."""
    from dfmp2.kernels.triton.pair_energy_epilogue import gemm_epilogue_pair_energy

    Bi, Bj, ei, ej, ev, evj = _opposite_spin_problem()
    ref = mp2_pair_energy_reference(Bi, Bj, ei, ej, ev, eps_vir_j=evj)
    for bi, bj in ((Bi, Bj), (pipeline_layout(Bi), pipeline_layout(Bj))):
        got = gemm_epilogue_pair_energy(bi, bj, ei, ej, ev, eps_vir_j=evj, block=16)
        assert abs(got[0] - ref[0]) <= 1e-14 * abs(ref[0]) and math.isnan(got[1]), (got, ref)
    got = gemm_epilogue_pair_energy(Bi.float(), Bj.float(), ei, ej, ev, eps_vir_j=evj)
    ref32 = mp2_pair_energy_reference(Bi.float(), Bj.float(), ei, ej, ev, eps_vir_j=evj, k_dtype=torch.float32)
    assert abs(got[0] - ref32[0]) <= 1e-6 * abs(ref32[0]), (got, ref32)
    with pytest.raises(ValueError, match="symmetric=True needs Bj to be Bi"):
        gemm_epilogue_pair_energy(Bi, Bi, ei, ei, ev, eps_vir_j=ev, symmetric=True)


@interpreted
def test_bad_arguments():
    from dfmp2.kernels.triton.fused_pair_energy import fused_pair_energy

    B, eo, ev = _problem(3, 5, 6)
    with pytest.raises(ValueError, match="differ"):
        fused_pair_energy(B, B[:, :4], eo, eo, ev)
    with pytest.raises(ValueError, match="symmetric"):
        fused_pair_energy(B, B[:2], eo, eo[:2], ev, symmetric=True)
    with pytest.raises(ValueError, match="eps_vir"):
        fused_pair_energy(B, B, eo, eo, ev[:4])
    with pytest.raises(ValueError, match="fp32 or both fp64"):
        fused_pair_energy(B, B.float(), eo, eo, ev)
