/* The CPU pair step's epilogue: MP2 opposite- and same-spin sums of the pair blocks of one tile of
 * K that a BLAS GEMM has just written, read once (the torch epilogue reads each K five to seven
 * times and copies its transpose through memory).
 *
 * Tile layout: K is (ni*nvir) x (nj*nvj), row-major, row stride ld (elements); the pair block of
 * occupied orbitals (i, j) is K[i*nvir + a, j*nvj + b], a < nvir, b < nvj, so
 *     K_ij[a][b] = sum_P B_ia^P B_jb^P   (Hartree),
 *     D_ab = eps_i + eps_j - eps_a - eps_b   (Hartree, negative for an occupied/virtual split).
 *
 * pair_sums_{d,f} (same spin, nvj = nvir): per pair out[2*(i*nj + j)] = sum_ab K_ab^2 / D_ab
 *     (the opposite-spin sum) and out[2*(i*nj + j) + 1] = sum_ab K_ab K_ba / D_ab (the exchange
 *     sum; e_ss = os - xs). Pairs with i0 + i < j0 + j are skipped (left as they are) when
 *     lower != 0: a diagonal block needs i >= j only.
 * pair_os_{d,f} (opposite spins, UMP2's alpha-beta block): out[i*nj + j] = sum_ab K_ab^2 / D_ab
 *     with eps_b from evj (nvj,).
 *
 * K is double (_d) or float (_f); every term and sum is double. The order of every sum is fixed by
 * TILE alone (32 x 32 sub-blocks, row by row), so a pair's sums do not depend on the tile it came
 * in, the thread that ran it or the machine's thread count. Plain C99, no OpenMP: the caller runs
 * one tile per thread (linalg/cpu_pair.py) and ctypes releases the GIL around each call.
 */
#include <stddef.h>

#define TILE 32

#define DEFINE_PAIR_SUMS(NAME, T)                                                                  \
static void NAME##_one(const T *K, long ld, long n, double eij, const double *ev, double *os_out,  \
                       double *xs_out)                                                             \
{                                                                                                  \
    double os = 0.0, xs = 0.0;                                                                     \
    for (long a0 = 0; a0 < n; a0 += TILE) {                                                        \
        long a1 = a0 + TILE < n ? a0 + TILE : n;                                                   \
        for (long b0 = a0; b0 < n; b0 += TILE) {                                                   \
            long b1 = b0 + TILE < n ? b0 + TILE : n;                                               \
            double tos = 0.0, txs = 0.0;                                                           \
            for (long a = a0; a < a1; a++) {                                                       \
                const double ea = eij - ev[a];                                                     \
                const T *Ka = K + a * ld;                                                          \
                long bs = b0;                                                                      \
                if (b0 == a0) {            /* the diagonal sub-block: a == b once, then b > a */   \
                    double kaa = (double)Ka[a];                                                    \
                    double t = kaa * kaa / (ea - ev[a]);                                           \
                    tos += t;                                                                      \
                    txs += t;                                                                      \
                    bs = a + 1;                                                                    \
                }                                                                                  \
                for (long b = bs; b < b1; b++) {   /* D_ab = D_ba: one division for both */        \
                    double kab = (double)Ka[b], kba = (double)K[b * ld + a];                       \
                    double r = 1.0 / (ea - ev[b]);                                                 \
                    tos += (kab * kab + kba * kba) * r;                                            \
                    txs += 2.0 * kab * kba * r;                                                    \
                }                                                                                  \
            }                                                                                      \
            os += tos;                                                                             \
            xs += txs;                                                                             \
        }                                                                                          \
    }                                                                                              \
    *os_out = os;                                                                                  \
    *xs_out = xs;                                                                                  \
}                                                                                                  \
                                                                                                   \
void NAME(const T *K, long ld, long ni, long nj, long nvir, const double *ei, const double *ej,    \
          const double *ev, int lower, long i0, long j0, double *out)                              \
{                                                                                                  \
    for (long i = 0; i < ni; i++)                                                                  \
        for (long j = 0; j < nj; j++) {                                                            \
            if (lower && i0 + i < j0 + j)                                                          \
                continue;                                                                          \
            NAME##_one(K + i * nvir * ld + j * nvir, ld, nvir, ei[i] + ej[j], ev,                  \
                       out + 2 * (i * nj + j), out + 2 * (i * nj + j) + 1);                        \
        }                                                                                          \
}

#define DEFINE_PAIR_OS(NAME, T)                                                                    \
void NAME(const T *K, long ld, long ni, long nj, long nvir, long nvj, const double *ei,             \
          const double *ej, const double *ev, const double *evj, double *out)                      \
{                                                                                                  \
    for (long i = 0; i < ni; i++)                                                                  \
        for (long j = 0; j < nj; j++) {                                                            \
            const T *Kij = K + i * nvir * ld + j * nvj;                                            \
            const double eij = ei[i] + ej[j];                                                      \
            double os = 0.0;                                                                       \
            for (long a = 0; a < nvir; a++) {                                                      \
                const double ea = eij - ev[a];                                                     \
                const T *Ka = Kij + a * ld;                                                        \
                double t = 0.0;                                                                    \
                for (long b = 0; b < nvj; b++) {                                                   \
                    double k = (double)Ka[b];                                                      \
                    t += k * k / (ea - evj[b]);                                                    \
                }                                                                                  \
                os += t;                                                                           \
            }                                                                                      \
            out[i * nj + j] = os;                                                                  \
        }                                                                                          \
}

DEFINE_PAIR_SUMS(pair_sums_d, double)
DEFINE_PAIR_SUMS(pair_sums_f, float)
DEFINE_PAIR_OS(pair_os_d, double)
DEFINE_PAIR_OS(pair_os_f, float)
