"""Triton kernels for CUDA GPUs (they also run on CPU tensors under TRITON_INTERPRET=1).

fused_pair_energy: the fused MP2 pair step (K tiles, denominators, OS/SS sums in one pass).
pair_energy_epilogue: the same sums from K blocks that a cuBLAS GEMM has written.
tile_sums: the OS/SS reduction over one tile pair that both kernels call.
"""
