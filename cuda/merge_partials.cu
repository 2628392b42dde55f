// Log-sum-exp combine of `parts` partial attention results.
// outs [parts, n, v_dim] fp32, lses [parts, n] fp32 -> out [n, v_dim], lse [n].
// One block per output row; empty partials (lse = -inf) weigh nothing; all empty gives
// a zero row and lse = -inf.
#include "common.cuh"

extern "C" __global__ void merge_partials_f32(const float* __restrict__ outs, const float* __restrict__ lses,
                                              int parts, long long n, int v_dim,
                                              float* __restrict__ out, float* __restrict__ lse) {
    const long long r = blockIdx.x;
    float big = -INFINITY;
    for (int p = 0; p < parts; p++) big = fmaxf(big, lses[p * n + r]);
    if (big == -INFINITY) {
        for (int e = threadIdx.x; e < v_dim; e += blockDim.x) out[r * v_dim + e] = 0.f;
        if (threadIdx.x == 0) lse[r] = -INFINITY;
        return;
    }
    float total = 0.f;
    for (int p = 0; p < parts; p++) total += __expf(lses[p * n + r] - big);
    for (int e = threadIdx.x; e < v_dim; e += blockDim.x) {
        float a = 0.f;
        for (int p = 0; p < parts; p++) a += __expf(lses[p * n + r] - big) * outs[(p * n + r) * v_dim + e];
        out[r * v_dim + e] = a / total;
    }
    if (threadIdx.x == 0) lse[r] = big + logf(total);
}
