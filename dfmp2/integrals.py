"""Raw integrals from PySCF/libcint: the fitting metric (P|Q) and 3-center (μν|P) in aux-shell blocks.

Everything here runs on the host in fp64; the caller moves blocks to its device.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np
from pyscf import gto, lib
from pyscf.gto import moleintor


def metric_2c(auxmol: gto.Mole) -> np.ndarray:
    """The Coulomb fitting metric j2c = (P|Q), shape (naux, naux), fp64."""
    return np.asarray(auxmol.intor("int2c2e", hermi=1))


def aux_shell_blocks(auxmol: gto.Mole, max_functions: int) -> list[tuple[int, int, int, int]]:
    """Split the auxiliary shells into contiguous blocks of at most ``max_functions`` functions
    (a single larger shell still gets a block of its own). Returns (shl0, shl1, p0, p1) tuples."""
    ao_loc = auxmol.ao_loc_nr()
    blocks, s0 = [], 0
    for s in range(1, auxmol.nbas + 1):
        if s == auxmol.nbas or ao_loc[s + 1] - ao_loc[s0] > max_functions:
            blocks.append((s0, s, int(ao_loc[s0]), int(ao_loc[s])))
            s0 = s
    return blocks


def iter_j3c_packed(mol: gto.Mole, auxmol: gto.Mole, blocks) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (p0, p1, j3c) with j3c = (μν|P) for μ >= ν only, packed in PySCF's order (the lower
    triangle row by row, ``lib.pack_tril``; pair index μ(μ+1)/2 + ν), shape (p1 - p0,
    nao(nao+1)/2), fp64: what libcint computes (aosym s2ij)."""
    intor = mol._add_suffix("int3c2e")
    atm, bas, env = gto.mole.conc_env(mol._atm, mol._bas, mol._env,
                                      auxmol._atm, auxmol._bas, auxmol._env)
    cintopt = moleintor.make_cintopt(atm, bas, env, intor)
    for s0, s1, p0, p1 in blocks:
        shls = (0, mol.nbas, 0, mol.nbas, mol.nbas + s0, mol.nbas + s1)
        packed = moleintor.getints(intor, atm, bas, env, shls, None, 0, "s2ij", None, cintopt)
        yield p0, p1, np.ascontiguousarray(packed.T)


def iter_j3c(mol: gto.Mole, auxmol: gto.Mole, blocks) -> Iterator[tuple[int, int, np.ndarray]]:
    """Yield (p0, p1, j3c) with j3c = (μν|P) for P in [p0, p1), shape (p1 - p0, nao, nao), fp64
    (``iter_j3c_packed``'s blocks unpacked to the full square)."""
    for p0, p1, packed in iter_j3c_packed(mol, auxmol, blocks):
        yield p0, p1, lib.unpack_tril(packed)
