"""Reading and writing: XYZ geometries, the checkpoint, atomic outputs, the result and its JSON.

``INPUTS``: the shipped molecules and reference energies (``dfmp2/inputs``: a link to the
repository's ``inputs/`` in a checkout, a copy in a wheel)."""

from pathlib import Path

INPUTS = Path(__file__).resolve().parent.parent / "inputs"
