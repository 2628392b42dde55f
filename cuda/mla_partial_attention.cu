// Partial MLA decode attention over selected tokens of a paged latent cache.
//
// One thread block per (query row, head), WARPS warps. Each warp walks every WARPS-th
// selected token: the 32 lanes compute q.k over `dim` elements (fp32 accumulation), then
// update an online-softmax state (max m, sum l, and the 512-wide accumulator spread 16
// elements per lane). The warps' states are combined by log-sum-exp at the end.
// Outputs: out [rows, heads, v_dim] fp32 (normalised) and lse [rows, heads] fp32 natural
// log, -inf with a zero output when nothing is attended. Token index -1 means padding.
// `idx_row_stride` is 0 when all rows share one selection, else the selection length.
//
// This is a straightforward kernel for correctness and a baseline; FlashMLA is the fast
// path on Hopper (see xbench/kernels/adapters.py).
#include "common.cuh"

constexpr int WARPS = 4;
constexpr int MAX_DIM = 576;
constexpr int MAX_V = 512;
constexpr int V_PER_LANE = MAX_V / 32;

template <typename T>
__device__ void partial_attention(const T* __restrict__ q, const T* __restrict__ kv,
                                  const long long* __restrict__ idx, long long idx_row_stride,
                                  int n_idx, int heads, int dim, int v_dim, float scale,
                                  float* __restrict__ out, float* __restrict__ lse) {
    const int head = blockIdx.x, row = blockIdx.y;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ float qs[MAX_DIM];
    __shared__ float warp_m[WARPS], warp_l[WARPS];
    __shared__ float warp_acc[WARPS][MAX_V];

    const long long qi = (long long)row * heads + head;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) qs[i] = to_float(q[qi * dim + i]);
    __syncthreads();

    const long long* sel = idx + (long long)row * idx_row_stride;
    float m = -INFINITY, l = 0.f, acc[V_PER_LANE];
#pragma unroll
    for (int j = 0; j < V_PER_LANE; j++) acc[j] = 0.f;

    for (int t = warp; t < n_idx; t += WARPS) {
        const long long tok = sel[t];
        if (tok < 0) continue;
        const T* k = kv + tok * dim;
        float s = 0.f;
        for (int i = lane; i < dim; i += 32) s += qs[i] * to_float(k[i]);
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        const float m_new = fmaxf(m, s);
        const float alpha = __expf(m - m_new);  // 0 on the first token (m = -inf)
        const float p = __expf(s - m_new);
        l = l * alpha + p;
#pragma unroll
        for (int j = 0; j < V_PER_LANE; j++) {
            const int e = lane + 32 * j;
            if (e < v_dim) acc[j] = acc[j] * alpha + p * to_float(k[e]);
        }
        m = m_new;
    }
    if (lane == 0) { warp_m[warp] = m; warp_l[warp] = l; }
#pragma unroll
    for (int j = 0; j < V_PER_LANE; j++) warp_acc[warp][lane + 32 * j] = acc[j];
    __syncthreads();

    float big = -INFINITY;
    for (int w = 0; w < WARPS; w++) big = fmaxf(big, warp_m[w]);
    if (big == -INFINITY) {
        for (int e = threadIdx.x; e < v_dim; e += blockDim.x) out[qi * v_dim + e] = 0.f;
        if (threadIdx.x == 0) lse[qi] = -INFINITY;
        return;
    }
    float total = 0.f;
    for (int w = 0; w < WARPS; w++) total += warp_l[w] * __expf(warp_m[w] - big);
    for (int e = threadIdx.x; e < v_dim; e += blockDim.x) {
        float a = 0.f;
        for (int w = 0; w < WARPS; w++) a += warp_acc[w][e] * __expf(warp_m[w] - big);
        out[qi * v_dim + e] = a / total;
    }
    if (threadIdx.x == 0) lse[qi] = big + logf(total);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
mla_partial_attention_bf16(const __nv_bfloat16* q, const __nv_bfloat16* kv, const long long* idx,
                           long long idx_row_stride, int n_idx, int heads, int dim, int v_dim,
                           float scale, float* out, float* lse) {
    partial_attention<__nv_bfloat16>(q, kv, idx, idx_row_stride, n_idx, heads, dim, v_dim, scale, out, lse);
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
mla_partial_attention_f32(const float* q, const float* kv, const long long* idx,
                          long long idx_row_stride, int n_idx, int heads, int dim, int v_dim,
                          float scale, float* out, float* lse) {
    partial_attention<float>(q, kv, idx, idx_row_stride, n_idx, heads, dim, v_dim, scale, out, lse);
}
