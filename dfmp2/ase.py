"""``dfmp2.ase.DFMP2Calculator``, the ASE calculator's public name (dfmp2.interfaces.ase)."""

from dfmp2.interfaces.ase import DFMP2Calculator

__all__ = ["DFMP2Calculator"]
