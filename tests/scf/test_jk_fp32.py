"""A mixed SCF's fp32 J and K on the host CPU (dfmp2.scf.jk.JKFactor._exchange_block_batched: one
GEMM per auxiliary function, B_P symmetric): the fp64 factor's J and K to fp32's rounding, for
a plain density and a split one (D = C+ C+^T - C- C-^T), in one pass (``jk``) and K alone
(``exchanges``), from the unpacked fp32 copy and from the factor on disk read as fp32."""

from pathlib import Path

import pytest
import torch

from dfmp2 import linalg
from dfmp2.df import basis
from dfmp2.df.outofcore import Scratch
from dfmp2.io import molecule as io_molecule
from dfmp2.io.xyz import read_xyz
from dfmp2.scf import jk
from dfmp2.timing import Timer

DIMER = Path(__file__).resolve().parents[2] / "inputs" / "water_clusters" / "h2o_02.xyz"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_fp32_exchange_is_the_fp64_one_to_fp32_rounding(tmp_path, monkeypatch):
    mol = io_molecule.build_molecule(read_xyz(DIMER))
    aux = basis.make_auxmol(mol, basis.default_auxbasis(mol, "jk"))
    cpu = linalg.get_backend("cpu")
    fac, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu))
    nao = mol.nao_nr()
    g = torch.Generator().manual_seed(11)
    Ca = torch.randn((nao, 6), generator=g, dtype=torch.float64) * 0.3
    Cb = torch.randn((nao, 5), generator=g, dtype=torch.float64) * 0.3
    factors = [(Ca, 4), (Cb, None)]  # a split density (4 columns +, 2 -) and a plain one
    J64, K64 = jk.unpacked(fac).jk(factors)
    calls = []
    batched = jk.JKFactor._exchange_block_batched
    monkeypatch.setattr(
        jk.JKFactor, "_exchange_block_batched", lambda self, *a: calls.append(a[2]) or batched(self, *a)
    )
    with Scratch(tmp_path) as scratch:
        disk, _ = jk.build_jk_factor(mol, aux, cpu, torch.float64, Timer(cpu), layout="disk", scratch=scratch, fit_mb=1)
        for f32 in (jk.fp32_unpacked(fac), disk.fp32()):
            calls.clear()
            J, K = f32.jk(factors)
            Kx = f32.exchanges(factors)
            assert calls and all(b.dtype == torch.float32 for b in calls)  # the batched path ran
            assert J.dtype == K.dtype == Kx.dtype == torch.float64
            for k in range(2):
                tol = 1e-5 * float(K64[k].abs().max())
                assert 0 < float((K[k] - K64[k]).abs().max()) < tol and float((Kx[k] - K64[k]).abs().max()) < tol
                assert torch.equal(K[k], K[k].mT)  # exactly symmetric
            assert float((J - J64).abs().max()) < 1e-5 * float(J64.abs().max())
