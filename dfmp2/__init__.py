"""dfmp2: DF-MP2 (RI-MP2) energies on CPU, CUDA GPUs and AWS Trainium."""
__version__ = "0.1.0"
