"""Where other tools meet us: the Python API, the PySCF drop-in, ASE, QCSchema and QCEngine."""
