"""Properties after the energy: one-electron properties of the MP2 densities (``stage.py``), the
dipole moments (``dipole.py``). The densities come from the gradient's machinery (dfmp2.grad)."""
