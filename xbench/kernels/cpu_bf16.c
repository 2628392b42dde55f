// bf16 x bf16 -> fp32 attention scores on CPUs with AVX512-BF16 (vdpbf16ps).
//
// torch on CPU rounds a bf16 matmul's output to bf16, which costs the scores the accuracy
// xbench's tests demand, and its fp32 matmul runs at under half the bf16 rate here. This
// kernel multiplies bf16 pairs and accumulates in fp32, as FlashMLA does on the GPU.
//
// xb_pack_keys: per block of KB keys, kp[d2][j] = the d-pair (2 d2, 2 d2 + 1) of key j, so
// one 512-bit load holds one d-pair of 16 keys and the query's d-pair is broadcast: no
// horizontal sums, and each packed block stays in L2 while every row tile reuses it.
// xb_scores_rows: out[l, j] = scale * q[l] . k[j] for rows [l0, l1), all keys.
// Callers run row ranges on several threads (the GIL is released in ctypes calls).
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define MR 6   /* rows per micro-tile */
#define NR 32  /* keys per micro-tile: two vectors */
#define KB 256 /* keys per packed block: D/2 x KB x 4 B = 288 KiB for D = 576, an L2's worth */

/* kp holds ceil(S / KB) blocks, each [D/2][KB] of key d-pairs, zero-padded. */
void xb_pack_keys(const uint16_t* k, int S, int D, uint32_t* kp) {
    const int blocks = (S + KB - 1) / KB;
    for (int b = 0; b < blocks; b++) {
        uint32_t* block = kp + (long)b * (D / 2) * KB;
        const int nb = S - b * KB < KB ? S - b * KB : KB;
        for (int j = 0; j < nb; j++) {
            const uint32_t* row = (const uint32_t*)(k + (long)(b * KB + j) * D);
            for (int d2 = 0; d2 < D / 2; d2++) block[(long)d2 * KB + j] = row[d2];
        }
        for (int j = nb; j < KB; j++)
            for (int d2 = 0; d2 < D / 2; d2++) block[(long)d2 * KB + j] = 0;
    }
}

void xb_scores_rows(const uint16_t* q, const uint32_t* kp, float* out, int l0, int l1, int S, int D, float scale) {
    const __m512 vscale = _mm512_set1_ps(scale);
    const int blocks = (S + KB - 1) / KB;
    for (int b = 0; b < blocks; b++) {
        const uint32_t* block = kp + (long)b * (D / 2) * KB;
        const int nb = S - b * KB < KB ? S - b * KB : KB;
        for (int lb = l0; lb < l1; lb += MR) {
            const int mr = l1 - lb < MR ? l1 - lb : MR;
            const uint32_t* qrow[MR];
            for (int r = 0; r < MR; r++) qrow[r] = (const uint32_t*)(q + (long)(lb + (r < mr ? r : 0)) * D);
            for (int jj = 0; jj < nb; jj += NR) {
                __m512 acc[MR][2];
                for (int r = 0; r < MR; r++) { acc[r][0] = _mm512_setzero_ps(); acc[r][1] = _mm512_setzero_ps(); }
                for (int d2 = 0; d2 < D / 2; d2++) {
                    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(block + (long)d2 * KB + jj);
                    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(block + (long)d2 * KB + jj + 16);
                    for (int r = 0; r < MR; r++) {
                        const __m512bh a = (__m512bh)_mm512_set1_epi32((int)qrow[r][d2]);
                        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
                        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
                    }
                }
                const int nn = nb - jj < NR ? nb - jj : NR;
                for (int r = 0; r < mr; r++) {
                    float tmp[NR];
                    _mm512_storeu_ps(tmp, _mm512_mul_ps(acc[r][0], vscale));
                    _mm512_storeu_ps(tmp + 16, _mm512_mul_ps(acc[r][1], vscale));
                    memcpy(out + (long)(lb + r) * S + b * KB + jj, tmp, (size_t)nn * sizeof(float));
                }
            }
        }
    }
}
