"""dfmp2: DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium.

``dfmp2.DFMP2(mf).run()`` (a PySCF drop-in on a converged RHF or UHF: PySCF's number by default)
``dfmp2.energy(xyz or Mole)`` and ``dfmp2.gradient(xyz or Mole)`` (the nuclear gradient) live in ``dfmp2.api``; ``dfmp2.ase.DFMP2Calculator`` is the ASE
calculator (needs ``ase``). They are imported on first use, so ``import dfmp2`` stays light (no
torch, no PySCF). The linear-algebra layer and the kernels are ``dfmp2.linalg`` and
``dfmp2.kernels`` (the repository's ``linalg/`` and ``kernels/``: ``dfmp2.layout``).
"""
from . import layout as _layout

_layout.install_checkout_finder()        # a checkout: dfmp2.linalg, dfmp2.kernels are its linalg/, kernels/

__version__ = "0.1.0"
__all__ = ["DFMP2", "energy", "gradient"]


def __getattr__(name):
    if name in __all__:
        from . import api
        return getattr(api, name)
    if name == "ase":                     # dfmp2.ase without importing it first, as for the API
        import importlib
        return importlib.import_module(".ase", __name__)
    raise AttributeError(f"module 'dfmp2' has no attribute '{name}'")
