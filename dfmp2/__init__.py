"""dfmp2: DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium.

``dfmp2.energy(xyz or Mole)``, ``dfmp2.gradient(xyz or Mole)`` (the nuclear gradient),
``dfmp2.frequencies(xyz or Mole)`` (harmonic frequencies, IR, thermochemistry) and
``dfmp2.DFMP2(mf).run()`` (a PySCF drop-in on a converged RHF or UHF: PySCF's number by default)
live in ``dfmp2.interfaces`` (``api`` and ``pyscf_dropin``); ``dfmp2.ase.DFMP2Calculator`` is the
ASE calculator (needs ``ase``),
``import dfmp2.qcengine`` registers the QCEngine harness. They are imported on first use, so
``import dfmp2`` stays light (no torch, no PySCF).

The package's folders: ``scf/``, ``df/``, ``mp2/``, ``grad/`` (the science), ``io/``,
``interfaces/``, ``workflows/``, ``cli/``, ``benchmarks/``. ``dfmp2/linalg``, ``dfmp2/kernels``
and ``dfmp2/inputs`` are links to the repository's top-level ``linalg/``, ``kernels/`` and
``inputs/`` (the project's fixed layout); a wheel holds copies.
"""

__version__ = "0.1.0"
__all__ = ["DFMP2", "energy", "frequencies", "gradient"]


def __getattr__(name):
    if name in ("energy", "gradient", "frequencies"):
        from dfmp2.interfaces import api

        return getattr(api, name)
    if name == "DFMP2":
        from dfmp2.interfaces import pyscf_dropin

        return pyscf_dropin.DFMP2
    if name == "ase":  # dfmp2.ase without importing it first, as for the API
        import importlib

        return importlib.import_module("dfmp2.ase")
    raise AttributeError(f"module 'dfmp2' has no attribute '{name}'")
