"""dfmp2: DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium.

``dfmp2.DFMP2(mf).run()`` (a PySCF drop-in on a converged RHF) and ``dfmp2.energy(xyz or Mole)``
live in ``dfmp2.api``; they are imported on first use, so ``import dfmp2`` stays light (no torch).
"""
__version__ = "0.1.0"
__all__ = ["DFMP2", "energy"]


def __getattr__(name):
    if name in __all__:
        from . import api
        return getattr(api, name)
    raise AttributeError(f"module 'dfmp2' has no attribute '{name}'")
