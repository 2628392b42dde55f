// Device-initiated probes: the GPU itself moves the bytes and times itself with the
// global timer (%globaltimer, ns), so no host overhead enters the figure.
//
// peer_pingpong / peer_put_loop work on memory of a peer GPU mapped into this one (CUDA
// IPC handles or peer access over NVLink or PCIe). The nvshmem_* kernels issue NVSHMEM
// puts from the device (over NVLink, or InfiniBand with IBGDA when NVSHMEM is configured
// for it); they are compiled only with -DXBENCH_WITH_NVSHMEM and NVSHMEM's headers and
// device library (relocatable device code, nvcc -rdc), as probe_device_main.cu is.
#include "common.cuh"

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// One thread each side: the initiator bumps the peer's flag and waits for its echo.
extern "C" __global__ void peer_pingpong(volatile unsigned long long* local_flag, volatile unsigned long long* remote_flag,
                                         int initiator, long long iters, unsigned long long* elapsed_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const unsigned long long t0 = global_ns();
    for (long long i = 1; i <= iters; i++) {
        if (initiator) {
            *remote_flag = (unsigned long long)i;
            __threadfence_system();
            while (*local_flag < (unsigned long long)i) {
            }
        } else {
            while (*local_flag < (unsigned long long)i) {
            }
            *remote_flag = (unsigned long long)i;
            __threadfence_system();
        }
    }
    *elapsed_ns = global_ns() - t0;
}

// Every thread of the grid copies 16-byte words to the peer, `iters` times; block 0's
// first thread records the span from its first store to the end of the last grid pass
// it observes (a grid barrier would need cooperative launch; the span is per block).
extern "C" __global__ void peer_put_loop(const int4* __restrict__ src, int4* __restrict__ dst, long long n16,
                                         long long iters, unsigned long long* elapsed_ns) {
    const unsigned long long t0 = global_ns();
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long it = 0; it < iters; it++) {
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n16; i += stride) dst[i] = src[i];
        __threadfence_system();
    }
    __syncthreads();
    if (blockIdx.x == 0 && threadIdx.x == 0) *elapsed_ns = global_ns() - t0;
}

#ifdef XBENCH_WITH_NVSHMEM
#include <nvshmem.h>
#include <nvshmemx.h>

// The timed loop with nothing in it but its count: the probes' own per-iteration cost on
// the GPU, which xbench probe --initiator device stores beside the samples (loop_overhead).
extern "C" __global__ void empty_loop(long long iters, unsigned long long* elapsed_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    volatile long long count = 0;
    const unsigned long long t0 = global_ns();
    for (long long i = 0; i < iters; i++) count = count + 1;
    *elapsed_ns = global_ns() - t0;
}

// Who issues a message: one thread (NVSHMEM's thread-scoped calls), one warp or the whole
// block (nvshmemx_*_warp / _block). Over NVLink a put is the issuing threads' own loads and
// stores to the peer, so one thread moves a KB-sized message at a fraction of a GB/s (0.59
// GB/s from 8 KiB up on an H200, session 43) where a warp or a block copies it together;
// over InfiniBand with IBGDA one of them posts the work request either way. Serving
// kernels that move KV pages (DeepEP's, for one) put with a warp.
#define XBENCH_SCOPE_THREAD 0
#define XBENCH_SCOPE_WARP 1
#define XBENCH_SCOPE_BLOCK 2

__device__ __forceinline__ void put_nbi_scoped(int scope, void* dst, const void* src, size_t bytes, int pe) {
    if (scope == XBENCH_SCOPE_BLOCK) {
        nvshmemx_putmem_nbi_block(dst, src, bytes, pe);
    } else if (scope == XBENCH_SCOPE_WARP) {
        if (threadIdx.x < 32) nvshmemx_putmem_nbi_warp(dst, src, bytes, pe);
    } else if (threadIdx.x == 0) {
        nvshmem_putmem_nbi(dst, src, bytes, pe);
    }
}

__device__ __forceinline__ void putsig_nbi_scoped(int scope, void* dst, const void* src, size_t bytes,
                                                  uint64_t* signal, uint64_t value, int pe) {
    if (scope == XBENCH_SCOPE_BLOCK) {
        nvshmemx_putmem_signal_nbi_block(dst, src, bytes, signal, value, NVSHMEM_SIGNAL_SET, pe);
    } else if (scope == XBENCH_SCOPE_WARP) {
        if (threadIdx.x < 32) nvshmemx_putmem_signal_nbi_warp(dst, src, bytes, signal, value, NVSHMEM_SIGNAL_SET, pe);
    } else if (threadIdx.x == 0) {
        nvshmem_putmem_signal_nbi(dst, src, bytes, signal, value, NVSHMEM_SIGNAL_SET, pe);
    }
}

// Puts back to back from block 0 at `scope`, then their completion; timed by thread 0.
extern "C" __global__ void nvshmem_put_loop(void* dst, const void* src, size_t bytes, int pe, int scope,
                                            long long iters, unsigned long long* elapsed_ns) {
    if (blockIdx.x != 0) return;
    const unsigned long long t0 = global_ns();
    for (long long i = 0; i < iters; i++) put_nbi_scoped(scope, dst, src, bytes, pe);
    __syncthreads();
    if (threadIdx.x == 0) {
        nvshmem_quiet();
        *elapsed_ns = global_ns() - t0;
    }
}

// Bandwidth: every block puts its share of `bytes` with the block-wide call, `iters` times,
// then waits for completion; timed from the host (events), as NVSHMEM's shmem_put_bw is.
extern "C" __global__ void nvshmem_put_bw(char* dst, const char* src, size_t bytes, int pe, long long iters) {
    const size_t share = (bytes + gridDim.x - 1) / gridDim.x;
    const size_t begin = share * blockIdx.x;
    const size_t n = begin >= bytes ? 0 : (bytes - begin < share ? bytes - begin : share);
    for (long long i = 0; i < iters; i++) {
        if (n) nvshmemx_putmem_nbi_block(dst + begin, src + begin, n, pe);
    }
    __syncthreads();
    if (threadIdx.x == 0) nvshmem_quiet();
}

// Put-with-signal ping-pong: the message and the signal that it has landed are one call,
// so nothing can overtake the payload; each side waits for the other's count. The counts
// run from `first` (1 after the signal word was zeroed; one past the last count when a
// launch continues the previous one's, as xbench probe's samples do). Block 0 puts at
// `scope`; its thread 0 waits and times.
extern "C" __global__ void nvshmem_putsig_pingpong(void* dst, const void* src, size_t bytes, uint64_t* signal, int pe,
                                                   int scope, int initiator, long long first, long long iters,
                                                   unsigned long long* elapsed_ns) {
    if (blockIdx.x != 0) return;
    const unsigned long long t0 = global_ns();
    for (long long i = first; i < first + iters; i++) {
        if (initiator) {
            putsig_nbi_scoped(scope, dst, src, bytes, signal, (uint64_t)i, pe);
            if (threadIdx.x == 0) nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, (uint64_t)i);
            __syncthreads();
        } else {
            if (threadIdx.x == 0) nvshmem_signal_wait_until(signal, NVSHMEM_CMP_GE, (uint64_t)i);
            __syncthreads();
            putsig_nbi_scoped(scope, dst, src, bytes, signal, (uint64_t)i, pe);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        nvshmem_quiet();
        *elapsed_ns = global_ns() - t0;
    }
}

extern "C" __global__ void nvshmem_pingpong(long long* flag, int pe, int initiator, long long iters,
                                            unsigned long long* elapsed_ns) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const unsigned long long t0 = global_ns();
    for (long long i = 1; i <= iters; i++) {
        if (initiator) {
            nvshmem_longlong_p(flag, i, pe);
            nvshmem_longlong_wait_until(flag, NVSHMEM_CMP_GE, i);
        } else {
            nvshmem_longlong_wait_until(flag, NVSHMEM_CMP_GE, i);
            nvshmem_longlong_p(flag, i, pe);
        }
    }
    *elapsed_ns = global_ns() - t0;
}
#endif
