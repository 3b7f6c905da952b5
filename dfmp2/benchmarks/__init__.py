"""Benchmarks of the linalg layer and the DF-MP2 stage: one job per module.

    timing.py       warm-up / synchronise / repeat timer, GEMM peak, machine and version metadata
    ops.py          per-op cases (gemm, syrk, trsm, cholesky, inverse square roots, pair energy):
                    flop counts, our call and the torch.linalg / scipy.linalg / PySCF baselines
    shapes.py       named DF-MP2 shapes (small, medium, large, ...) and the op sizes they imply
    trn_estimate.py Trainium (trn1, trn2) time ESTIMATES from the NKI kernels' work and published rates
    waters.py       the water-cluster series (whole DF-MP2 stage vs PySCF) and cost-exponent fits
    report.py       terminal table, JSON, markdown and PNG plot
    run.py          the ``dfmp2 bench`` driver that ties them together

``dfmp2 bench`` (dfmp2/cli/bench.py) and scripts/bench_linalg.py are thin callers of these.
"""
