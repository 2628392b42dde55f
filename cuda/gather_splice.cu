// The move-the-cache primitive's device work besides the wire.
//
// gather: pack the selected tokens of a paged cache contiguously (at the holder).
// splice: write packed tokens into slots of free pages (at the requester), copying the
// latent part bit for bit and re-rotating the trailing RoPE part (interleaved pairs) by
// `shift[i] * inv_freq[j]`, computed in double and rounded once to the cache dtype.
#include "common.cuh"

template <typename T>
__device__ void gather(const T* __restrict__ kv, const long long* __restrict__ idx, long long n, int dim,
                       T* __restrict__ packed) {
    const long long total = n * dim;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / dim, e = i % dim;
        packed[i] = kv[idx[t] * dim + e];
    }
}

template <typename T>
__device__ void splice(T* __restrict__ kv, const T* __restrict__ packed, const long long* __restrict__ slots,
                       const long long* __restrict__ shift, const double* __restrict__ inv_freq,
                       long long n, int dim, int rope_dim) {
    const int latent = dim - rope_dim;
    const int width = latent + rope_dim / 2;  // one work item per latent element or RoPE pair
    const long long total = n * width;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / width;
        const int e = (int)(i % width);
        T* dst = kv + slots[t] * dim;
        const T* src = packed + t * dim;
        if (e < latent) {
            dst[e] = src[e];
        } else {
            const int j = e - latent;
            const double angle = (double)shift[t] * inv_freq[j];
            double s, c;
            sincos(angle, &s, &c);
            const double x0 = to_float(src[latent + 2 * j]), x1 = to_float(src[latent + 2 * j + 1]);
            dst[latent + 2 * j] = from_double<T>(x0 * c - x1 * s);
            dst[latent + 2 * j + 1] = from_double<T>(x0 * s + x1 * c);
        }
    }
}

extern "C" __global__ void gather_kv_bf16(const __nv_bfloat16* kv, const long long* idx, long long n, int dim, __nv_bfloat16* packed) {
    gather<__nv_bfloat16>(kv, idx, n, dim, packed);
}
extern "C" __global__ void gather_kv_f32(const float* kv, const long long* idx, long long n, int dim, float* packed) {
    gather<float>(kv, idx, n, dim, packed);
}
extern "C" __global__ void splice_kv_bf16(__nv_bfloat16* kv, const __nv_bfloat16* packed, const long long* slots,
                                          const long long* shift, const double* inv_freq, long long n, int dim, int rope_dim) {
    splice<__nv_bfloat16>(kv, packed, slots, shift, inv_freq, n, dim, rope_dim);
}
extern "C" __global__ void splice_kv_f32(float* kv, const float* packed, const long long* slots,
                                         const long long* shift, const double* inv_freq, long long n, int dim, int rope_dim) {
    splice<float>(kv, packed, slots, shift, inv_freq, n, dim, rope_dim);
}
