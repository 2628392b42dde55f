// MLA partial attention for bf16 caches on CPUs with AVX512-BF16 (vdpbf16ps), for the torch
// backend's CPU path.
//
// torch on CPU rounds a bf16 matmul's output to bf16, which costs the scores the accuracy
// xbench's tests demand, and its fp32 matmul runs at under half the bf16 rate here. This
// kernel multiplies bf16 pairs and accumulates in fp32, as FlashMLA does on the GPU:
//   pack   K and V straight from the cache rows (a dense range or a token index list, so a
//          sparse selection is read once, with no gathered copy);
//   scores s = scale q.k for a block of RB rows, softmax while they are in cache
//          (p = bf16(exp(s - max)), fp32 sum), then out = (p @ V) / sum and
//          lse = max + log(sum), all in fp32.
// Packed layouts: K in panels of NR keys, panel[d2][j] = the d-pair (2 d2, 2 d2 + 1) of key
// j, so one 512-bit load holds a d-pair of 16 keys and the query's d-pair is broadcast; V in
// tiles of 32 columns, tile[j2][v] = (V[2 j2][v], V[2 j2 + 1][v]), so the probabilities'
// token pair is broadcast. Threads: OpenMP on torch's own runtime (the library is loaded
// after torch, whose libgomp.so.1 satisfies ours).
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#define MR 8   /* rows per micro-tile */
#define NR 32  /* keys per panel and micro-tile: two vectors */
#define RB 64  /* rows per block: their scores (RB x S fp32) stay in L2 for the softmax */

static inline long panels_of(int S) { return (S + NR - 1) / NR; }

#define VT 32  /* V columns per packed tile */

static inline const uint16_t* token_row(const uint16_t* cache, const int64_t* idx, long start,
                                        long t, int D) {
    return cache + (idx ? idx[t] : start + t) * (long)D;
}

/* kp: panels_of(S) panels of [D/2][NR] key d-pairs, zero-padded past S.
 * vp (may be NULL): Dv/VT tiles of [S2][VT] token pairs, S2 = ceil(S/2), zero-padded. */
void xb_pack_kv(const uint16_t* cache, const int64_t* idx, long start, int S, int D, int Dv,
                uint32_t* kp, uint32_t* vp, int threads) {
    const int D2 = D / 2;
    const long S2 = (S + 1) / 2;
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8,
                                        39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
    const __m512i hi = _mm512_set_epi16(63, 31, 62, 30, 61, 29, 60, 28, 59, 27, 58, 26, 57, 25, 56, 24,
                                        55, 23, 54, 22, 53, 21, 52, 20, 51, 19, 50, 18, 49, 17, 48, 16);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (long p = 0; p < panels_of(S); p++) {
        uint32_t* panel = kp + p * D2 * NR;
        for (int j = 0; j < NR; j += 2) {
            const long t = p * NR + j;
            const uint16_t* ra = t < S ? token_row(cache, idx, start, t, D) : NULL;
            const uint16_t* rb = t + 1 < S ? token_row(cache, idx, start, t + 1, D) : NULL;
            for (int d2 = 0; d2 < D2; d2++) {
                panel[(long)d2 * NR + j] = ra ? ((const uint32_t*)ra)[d2] : 0;
                panel[(long)d2 * NR + j + 1] = rb ? ((const uint32_t*)rb)[d2] : 0;
            }
            if (!vp || !ra) continue;
            const long j2 = t / 2;
            for (int v = 0; v < Dv; v += VT) {
                const __m512i a = _mm512_loadu_si512(ra + v);
                const __m512i b = rb ? _mm512_loadu_si512(rb + v) : _mm512_setzero_si512();
                uint32_t* dst = vp + ((long)(v / VT) * S2 + j2) * VT;
                _mm512_storeu_si512(dst, _mm512_permutex2var_epi16(a, lo, b));
                _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi16(a, hi, b));
            }
        }
    }
}

/* The micro-kernel of both products: acc[r][0..1] (32 fp32 lanes) = sum over k < K of the
 * bf16 pair a[r][k] times the 32 pairs at b + 32 k (NR = VT = 32 pairs per step). */
static inline void dot_tile(const uint32_t* const a[MR], const uint32_t* b, long K,
                            __m512 acc[MR][2]) {
    for (int r = 0; r < MR; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++, b += 32) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        for (int r = 0; r < MR; r++) {
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)a[r][k]);
            acc[r][0] = _mm512_dpbf16_ps(acc[r][0], x, b0);
            acc[r][1] = _mm512_dpbf16_ps(acc[r][1], x, b1);
        }
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
            dot_tile(qrow, panel, D2, acc);
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

/* out[r, :] = (p[r] @ V) / rowsum[r] for r < nrows; p rows have stride 2 S2 (zero tail).
 * out is fp32, or bf16 (rounded to nearest even) when out_bf16: the partial then goes
 * straight into a message in the wire format, as FlashMLA's bf16 output would. */
static void pv_block(const uint16_t* p, long S2, const uint32_t* vp, int Dv, void* out,
                     int out_bf16, int nrows, const float* rowsum) {
    for (int c = 0; c < Dv; c += VT) {
        const uint32_t* tile = vp + (long)(c / VT) * S2 * VT;
        for (int rb = 0; rb < nrows; rb += MR) {
            const int mr = nrows - rb < MR ? nrows - rb : MR;
            const uint32_t* prow[MR];
            for (int r = 0; r < MR; r++)
                prow[r] = (const uint32_t*)(p + (long)(rb + (r < mr ? r : 0)) * 2 * S2);
            __m512 acc[MR][2];
            dot_tile(prow, tile, S2, acc);
            for (int r = 0; r < mr; r++) {
                const __m512 inv = _mm512_set1_ps(1.0f / rowsum[rb + r]);
                const long at = (long)(rb + r) * Dv + c;
                const __m512 lo = _mm512_mul_ps(acc[r][0], inv), hi = _mm512_mul_ps(acc[r][1], inv);
                if (out_bf16) {
                    _mm512_storeu_si512((uint16_t*)out + at, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
                } else {
                    _mm512_storeu_ps((float*)out + at, lo);
                    _mm512_storeu_ps((float*)out + at + 16, hi);
                }
            }
        }
    }
}

/* Attention of q [L, D] over S selected cache rows: out [L, Dv] fp32 (bf16 when out_bf16),
 * lse [L] fp32 (natural log).
 * kp, vp: packing space (see xb_pack_kv); sc: threads x RB x S fp32; pb: threads x RB x 2 S2
 * bf16. S >= 1, D even, Dv a multiple of 32 and <= D. */
void xb_attention(const uint16_t* q, int L, const uint16_t* cache, const int64_t* idx, long start,
                  int S, int D, int Dv, float scale, uint32_t* kp, uint32_t* vp, float* sc,
                  uint16_t* pb, void* out, int out_bf16, float* lse, int threads) {
    const long S2 = (S + 1) / 2;
    xb_pack_kv(cache, idx, start, S, D, Dv, kp, vp, threads);
    const int blocks = (L + RB - 1) / RB;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < blocks; b++) {
        const int tid = omp_get_thread_num();
        float* s = sc + (long)tid * RB * S;
        uint16_t* p = pb + (long)tid * RB * 2 * S2;
        float rowsum[RB];
        const int l0 = b * RB, nrows = L - l0 < RB ? L - l0 : RB;
        scores_block(q, kp, s, l0, nrows, S, D, scale);
        for (int r = 0; r < nrows; r++) {
            float m;
            softmax_row(s + (long)r * S, p + (long)r * 2 * S2, S, &m, rowsum + r);
            if (S & 1) p[(long)r * 2 * S2 + S] = 0;
            lse[l0 + r] = m + logf(rowsum[r]);
        }
        void* dst = out_bf16 ? (void*)((uint16_t*)out + (long)l0 * Dv) : (void*)((float*)out + (long)l0 * Dv);
        pv_block(p, S2, vp, Dv, dst, out_bf16, nrows, rowsum);
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

/* Merge P partial results of the same rows: outs [P][R][V] and lses [P][R] fp32 give
 * out [R][V] = sum_p w_p outs[p] with w_p = exp(lse_p - lse), lse = log sum_p exp(lse_p).
 * Partials over no keys carry lse = -inf and weigh nothing; a row with no keys at all gets
 * out 0 and lse -inf (as the torch merge). One pass per row, no temporaries. */
void xb_merge_parts(const void* const* outs, const int* bf16, const float* const* lses, int P,
                    long R, int V, float* out, float* lse, int threads);

void xb_merge(const float* outs, const float* lses, int P, long R, int V, float* out, float* lse,
              int threads) {
    const void* out_p[P];
    const float* lse_p[P];
    int bf16[P];
    for (int p = 0; p < P; p++) {
        out_p[p] = outs + (long)p * R * V;
        lse_p[p] = lses + (long)p * R;
        bf16[p] = 0;
    }
    xb_merge_parts(out_p, bf16, lse_p, P, R, V, out, lse, threads);
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = {.u = (uint32_t)h << 16};
    return v.f;
}

/* torch's float -> bf16: round to nearest even, any NaN to the canonical quiet NaN. */
static inline uint16_t float_to_bf16(float f) {
    union { float f; uint32_t u; } v = {.f = f};
    if (f != f) return 0x7FC0;
    return (uint16_t)((v.u + 0x7FFFu + ((v.u >> 16) & 1u)) >> 16);
}

/* xb_merge over P partials given by pointers, each out [R][V] fp32 or bf16 (bf16[p] != 0)
 * with lse [R] fp32: the requester merges a received wire-format partial (bf16 output,
 * fp32 LSE, read in place from the message) with its own fp32 partial, with no copies. */
void xb_merge_parts(const void* const* outs, const int* bf16, const float* const* lses, int P,
                    long R, int V, float* out, float* lse, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
    for (long r = 0; r < R; r++) {
        float m = -INFINITY;
        for (int p = 0; p < P; p++) m = fmaxf(m, lses[p][r]);
        float* o = out + r * V;
        for (int v = 0; v < V; v++) o[v] = 0.0f;
        if (m == -INFINITY) {
            lse[r] = -INFINITY;
            continue;
        }
        float total = 0.0f;
        for (int p = 0; p < P; p++) total += expf(lses[p][r] - m);
        for (int p = 0; p < P; p++) {
            const float w = expf(lses[p][r] - m) / total;
            if (bf16[p]) {
                const uint16_t* src = (const uint16_t*)outs[p] + r * V;
                for (int v = 0; v < V; v++) o[v] += w * bf16_to_float(src[v]);
            } else {
                const float* src = (const float*)outs[p] + r * V;
                for (int v = 0; v < V; v++) o[v] += w * src[v];
            }
        }
        lse[r] = m + logf(total);
    }
}

/* The requester's splice: token t of packed [n][D] (bf16) goes to slot
 * pages[t / bs] * bs + t % bs of cache [.][bs][D]; its first D - rope values are copied,
 * its last rope values, interleaved pairs (x0, x1), turned by the angle shift * freqs[i]
 * for pair i. Arithmetic as rope.rotate's: the turn's cos and sin from libm (torch.polar
 * calls the same std::cos / std::sin), the complex product in float64 with no fused
 * multiply-add, then float64 -> float -> bf16 as torch casts: bit for bit torch's splice. */
__attribute__((optimize("fp-contract=off"))) void xb_splice(uint16_t* cache,
                                                           const int64_t* pages, int bs,
                                                           const uint16_t* packed, long n, int D,
                                                           int rope, const double* freqs,
                                                           double shift) {
    const int keep = D - rope, half = rope / 2;
    double cs[half > 0 ? 2 * half : 1];
    for (int i = 0; i < half; i++) {
        const double angle = shift * freqs[i];
        cs[2 * i] = cos(angle);
        cs[2 * i + 1] = sin(angle);
    }
    for (long t = 0; t < n; t++) {
        uint16_t* dst = cache + (pages[t / bs] * bs + t % bs) * (long)D;
        const uint16_t* src = packed + t * (long)D;
        memcpy(dst, src, (size_t)keep * sizeof(uint16_t));
        for (int i = 0; i < half; i++) {
            const double a = bf16_to_float(src[keep + 2 * i]);
            const double b = bf16_to_float(src[keep + 2 * i + 1]);
            const double c = cs[2 * i], s = cs[2 * i + 1];
            const double ac = a * c, bd = b * s, ad = a * s, bc = b * c;
            dst[keep + 2 * i] = float_to_bf16((float)(ac - bd));
            dst[keep + 2 * i + 1] = float_to_bf16((float)(ad + bc));
        }
    }
}
