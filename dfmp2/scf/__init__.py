"""The self-consistent field: our DF-RHF/DF-UHF (JK factor, DIIS), its stability check, PySCF's SCF runs."""
