// bf16 attention scores and softmax on CPUs with AVX512-BF16 (vdpbf16ps), for the torch
// backend's CPU path.
//
// torch on CPU rounds a bf16 matmul's output to bf16, which costs the scores the accuracy
// xbench's tests demand, and its fp32 matmul runs at under half the bf16 rate here. This
// kernel multiplies bf16 pairs and accumulates in fp32, as FlashMLA does on the GPU, then
// does the softmax in the same pass over each row block while the scores are in cache:
// p = bf16(exp(s - max)), with the row max and the fp32 sum of exp returned for the LSE.
// The second product (p @ V) stays with torch's bf16 matmul, which runs at the ceiling.
//
// xb_pack_keys: keys in panels of NR: panel[d2][j] = the d-pair (2 d2, 2 d2 + 1) of key j,
// so the micro-kernel streams one panel sequentially, one 512-bit load holds a d-pair of
// 16 keys, and the query's d-pair is broadcast: no horizontal sums.
// xb_attend_rows: for rows [0, L) on `threads` OpenMP threads (torch's own runtime: the
// library is loaded after torch, whose libgomp.so.1 satisfies ours), scores, row max, exp,
// sum and the bf16 probabilities.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define MR 8   /* rows per micro-tile */
#define NR 32  /* keys per panel and micro-tile: two vectors */
#define RB 64  /* rows per block: their scores (RB x S fp32) stay in L2 for the softmax */

static inline long panels_of(int S) { return (S + NR - 1) / NR; }

/* kp holds panels_of(S) panels, each [D/2][NR] of key d-pairs, zero-padded. */
void xb_pack_keys(const uint16_t* k, int S, int D, uint32_t* kp, int threads) {
    const int D2 = D / 2;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long p = 0; p < panels_of(S); p++) {
        uint32_t* panel = kp + p * D2 * NR;
        const int nb = S - p * NR < NR ? S - (int)p * NR : NR;
        for (int j = 0; j < nb; j++) {
            const uint32_t* row = (const uint32_t*)(k + (p * NR + j) * D);
            for (int d2 = 0; d2 < D2; d2++) panel[(long)d2 * NR + j] = row[d2];
        }
        for (int j = nb; j < NR; j++)
            for (int d2 = 0; d2 < D2; d2++) panel[(long)d2 * NR + j] = 0;
    }
}

/* sc[r, j] = scale * q[l0 + r] . k[j] for r < nrows (<= RB), every key. */
static void scores_block(const uint16_t* q, const uint32_t* kp, float* sc, int l0, int nrows,
                         int S, int D, float scale) {
    const int D2 = D / 2;
    const __m512 vscale = _mm512_set1_ps(scale);
    for (long p = 0; p < panels_of(S); p++) {
        const uint32_t* panel = kp + p * D2 * NR;
        const int nn = S - p * NR < NR ? S - (int)p * NR : NR;
        for (int rb = 0; rb < nrows; rb += MR) {
            const int mr = nrows - rb < MR ? nrows - rb : MR;
            const uint32_t* qrow[MR];
            for (int r = 0; r < MR; r++)
                qrow[r] = (const uint32_t*)(q + (long)(l0 + rb + (r < mr ? r : 0)) * D);
            __m512 acc[MR][2];
            for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
            const uint32_t* b = panel;
            for (int d2 = 0; d2 < D2; d2++, b += NR) {
                const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
                const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
                for (int r = 0; r < MR; r++) {
                    const __m512bh a = (__m512bh)_mm512_set1_epi32((int)qrow[r][d2]);
                    acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
                    acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
                }
            }
            for (int r = 0; r < mr; r++) {
                float* dst = sc + (long)(rb + r) * S + p * NR;
                const __m512 v0 = _mm512_mul_ps(acc[r][0], vscale);
                const __m512 v1 = _mm512_mul_ps(acc[r][1], vscale);
                if (nn == NR) {
                    _mm512_storeu_ps(dst, v0);
                    _mm512_storeu_ps(dst + 16, v1);
                } else {
                    const __mmask16 m0 = nn >= 16 ? 0xFFFF : (__mmask16)((1u << nn) - 1);
                    const __mmask16 m1 = nn <= 16 ? 0 : (__mmask16)((1u << (nn - 16)) - 1);
                    _mm512_mask_storeu_ps(dst, m0, v0);
                    _mm512_mask_storeu_ps(dst + 16, m1, v1);
                }
            }
        }
    }
}

/* exp(x) for x <= 0 to about 1 ulp: 2^n * e^r with |r| <= ln2/2 and a degree-7 Taylor
 * polynomial (truncation below 5e-9 relative). Below -87.3 the result underflows to ~0. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 y = _mm512_set1_ps(1.0f / 5040);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 720));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 120));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 24));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f / 6));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* Row r of sc -> p (bf16, round to nearest even as torch's .to(bfloat16)), max and sum. */
static void softmax_row(const float* s, uint16_t* p, int S, float* rowmax, float* rowsum) {
    __m512 vm = _mm512_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 16 <= S; j += 16) vm = _mm512_max_ps(vm, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(vm);
    for (; j < S; j++) m = s[j] > m ? s[j] : m;
    const __m512 vmax = _mm512_set1_ps(m);
    __m512 vs = _mm512_setzero_ps();
    for (j = 0; j + 16 <= S; j += 16) {
        const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), vmax));
        vs = _mm512_add_ps(vs, e);
        _mm256_storeu_si256((__m256i*)(p + j), (__m256i)_mm512_cvtneps_pbh(e));
    }
    if (j < S) {
        const __mmask16 k = (__mmask16)((1u << (S - j)) - 1);
        const __m512 x = _mm512_mask_loadu_ps(vmax, k, s + j); /* padding: exp(0), masked off */
        const __m512 e = _mm512_maskz_mov_ps(k, exp_nonpositive(_mm512_sub_ps(x, vmax)));
        vs = _mm512_add_ps(vs, e);
        _mm256_mask_storeu_epi16(p + j, k, (__m256i)_mm512_cvtneps_pbh(e));
    }
    *rowmax = m;
    *rowsum = _mm512_reduce_add_ps(vs);
}

/* Scratch: threads x RB x S fp32. p: [L, S] bf16. rowmax, rowsum: [L] fp32. */
void xb_attend_rows(const uint16_t* q, const uint32_t* kp, float* scratch, uint16_t* p,
                    float* rowmax, float* rowsum, int L, int S, int D, float scale, int threads) {
    const int blocks = (L + RB - 1) / RB;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        float* sc = scratch + (long)omp_get_thread_num() * RB * S;
        const int l0 = b * RB, nrows = L - l0 < RB ? L - l0 : RB;
        scores_block(q, kp, sc, l0, nrows, S, D, scale);
        for (int r = 0; r < nrows; r++)
            softmax_row(sc + (long)r * S, p + (long)(l0 + r) * S, S, rowmax + l0 + r,
                        rowsum + l0 + r);
    }
}

/* Scores only (no softmax), for tests of the product: out [L, S] fp32. */
void xb_scores(const uint16_t* q, const uint32_t* kp, float* out, int L, int S, int D,
               float scale, int threads) {
    const int blocks = (L + RB - 1) / RB;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        const int l0 = b * RB, nrows = L - l0 < RB ? L - l0 : RB;
        scores_block(q, kp, out + (long)l0 * S, l0, nrows, S, D, scale);
    }
}
