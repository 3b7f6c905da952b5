"""CPU kernels in plain C, compiled on first use with the system's C compiler (build.py) and called
through ctypes.

pair_epilogue: the MP2 pair step's OS/SS sums over the pair blocks of one tile of K, read once,
after a BLAS GEMM has written the tile (linalg/cpu_pair.py drives it).
"""
