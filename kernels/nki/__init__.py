"""NKI kernels for Trainium (trn1, trn2), one kernel per module:

    gemm.py      gemm_kernel            out = lhsT.T @ rhs
    syrk.py      syrk_lower_kernel      lower tile blocks of A A^T
    trsm.py      trsm_lower_kernel      L X = B, blocked, diagonal-block inverses given
    mp2_pair.py  mp2_pair_kernel        fused MP2 OS / exchange sums for a block of pairs

``lang.py`` provides the ``nl``/``nisa`` names the kernels use; ``engines.py`` runs them on
Trainium hardware, on AWS's nki.simulate, or on kernels/nki_emulator (NumPy).
"""
