"""The DF-MP2 nuclear gradient after the energy (RHF and UHF) and the run that drives it."""
