"""Jobs over many runs: CBS brackets, interaction energies, geometry optimisation, regression, comparison."""
