// xbench-device-probe: the device-initiated probes of probe_device.cu, as a program.
//
// Built with nvcc against NVSHMEM's headers, host library and device library (relocatable
// device code), as NVSHMEM's own perftest programs are:
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -rdc=true -I$NVSHMEM/include probe_device_main.cu
//        -o xbench-device-probe -L$NVSHMEM/lib -l:libnvshmem_host.so.3 -lnvshmem_device -lcuda
//
// One PE (run alone): NVSHMEM starts from a unique id made here, every put goes to this
// PE itself; two PEs (under a launcher with NVSHMEM_BOOTSTRAP set, one GPU each): PE 0
// initiates, PE 1 answers. Without NVSHMEM (-DXBENCH_NO_NVSHMEM) only the peer loops run.
// The peer loops (no NVSHMEM; alone with --peer-only) run on GPU 0: two kernels on two
// streams bump each other's flag in its memory, and a grid copies a buffer to another on it;
// then, where the process sees two GPUs, between GPUs 0 and 1 through peer access.
//
// Prints one JSON object a line: {"probe", "bytes", "iters", "us" (per iteration: one-way
// for ping-pongs, i.e. half the round trip), "gb_per_s", "checked"}; "error" on failure.
// Exit 0 when every probe ran and every byte checked, 1 otherwise.
#ifndef XBENCH_NO_NVSHMEM
#define XBENCH_WITH_NVSHMEM
#endif
#include "probe_device.cu"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int failures = 0;

#define CHECK(call)                                                                              \
    do {                                                                                         \
        cudaError_t err_ = (call);                                                               \
        if (err_ != cudaSuccess) {                                                               \
            printf("{\"error\": \"%s: %s\", \"line\": %d}\n", #call, cudaGetErrorString(err_), __LINE__); \
            fflush(stdout);                                                                      \
            exit(2);                                                                             \
        }                                                                                        \
    } while (0)

// Waits for a stream with a deadline: a ping-pong whose partner never runs spins forever.
static bool finish(cudaStream_t s, double seconds) {
    auto t0 = std::chrono::steady_clock::now();
    while (cudaStreamQuery(s) == cudaErrorNotReady) {
        if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > seconds) return false;
    }
    CHECK(cudaGetLastError());
    return true;
}

static void fill(char* dev, size_t bytes, unsigned seed) {
    std::vector<unsigned char> host(bytes);
    for (size_t i = 0; i < bytes; i++) host[i] = (unsigned char)((i * 131u + seed) >> 3);
    CHECK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
}

static bool same(const char* a, const char* b, size_t bytes) {
    std::vector<char> ha(bytes), hb(bytes);
    CHECK(cudaMemcpy(ha.data(), a, bytes, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hb.data(), b, bytes, cudaMemcpyDeviceToHost));
    return memcmp(ha.data(), hb.data(), bytes) == 0;
}

// extra: more of the line's JSON fields: "gpus" for a peer loop (which GPUs it ran between,
// "0" or "0-1"; the NVSHMEM probes say their PEs), "scope" and "blocks" for a put.
static void report(const char* probe, size_t bytes, long long iters, double us, bool checked,
                   const char* extra = nullptr) {
    double gbps = us > 0 ? bytes / (us * 1e3) : 0.0;
    printf("{\"probe\": \"%s\", \"bytes\": %zu, \"iters\": %lld, \"us\": %.4f, \"gb_per_s\": %.3f, \"checked\": %s",
           probe, bytes, iters, us, gbps, checked ? "true" : "false");
    if (extra) printf(", %s", extra);
    printf("}\n");
    fflush(stdout);
    if (!checked) failures++;
}

static void fail(const char* probe, const char* why, const char* extra = nullptr) {
    printf("{\"probe\": \"%s\", \"error\": \"%s\"", probe, why);
    if (extra) printf(", %s", extra);
    printf("}\n");
    fflush(stdout);
    failures++;
}

static const size_t SIZES[] = {8, 64, 1024, 8192, 65536, 1 << 20, 16 << 20, 256 << 20};
static const size_t MOST = 256 << 20;

// Iterations so that a size's loop moves about `target` bytes, within [lo, hi].
static long long iterations(size_t bytes, double target, long long lo, long long hi) {
    long long n = (long long)(target / (double)bytes);
    return n < lo ? lo : (n > hi ? hi : n);
}

// The peer loops between GPU a and GPU b: two kernels, one on each (on one GPU when a == b,
// on two streams), each polling a flag in its own GPU's memory and storing into the other's
// (through peer access between two GPUs: NVLink, or PCIe), then a grid on a copying a buffer
// into one on b (read plus write counted once). Lines carry "gpus": "0", or "0-1".
static void peer_loops(int a, int b) {
    char gpus[48];
    snprintf(gpus, sizeof gpus, a == b ? "\"gpus\": \"%d\"" : "\"gpus\": \"%d-%d\"", a, b);
    if (a != b) {
        int ab = 0, ba = 0;
        CHECK(cudaDeviceCanAccessPeer(&ab, a, b));
        CHECK(cudaDeviceCanAccessPeer(&ba, b, a));
        if (!ab || !ba) {
            fail("peer_pingpong", "these GPUs cannot map each other's memory (cudaDeviceCanAccessPeer)", gpus);
            return;
        }
        for (int side = 0; side < 2; side++) {
            CHECK(cudaSetDevice(side ? b : a));
            const cudaError_t err = cudaDeviceEnablePeerAccess(side ? a : b, 0);
            if (err == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();  // clears it
            else CHECK(err);
        }
    }
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, a));
    unsigned long long *flag_a, *flag_b, *elapsed_a, *elapsed_b;
    cudaStream_t s_a, s_b;
    CHECK(cudaSetDevice(b));
    CHECK(cudaMalloc(&flag_b, sizeof(unsigned long long)));
    CHECK(cudaMalloc(&elapsed_b, sizeof(unsigned long long)));
    CHECK(cudaStreamCreateWithFlags(&s_b, cudaStreamNonBlocking));
    CHECK(cudaSetDevice(a));
    CHECK(cudaMalloc(&flag_a, sizeof(unsigned long long)));
    CHECK(cudaMalloc(&elapsed_a, sizeof(unsigned long long)));
    CHECK(cudaStreamCreateWithFlags(&s_a, cudaStreamNonBlocking));
    for (int round = 0; round < 2; round++) {  // the first is a warm-up
        const long long iters = round ? 100000 : 1000;
        // both flags zeroed and both GPUs idle before either kernel starts: a device-wide
        // wait after the responder's launch would wait for it, and it waits for the initiator
        CHECK(cudaSetDevice(b));
        CHECK(cudaMemset(flag_b, 0, sizeof(unsigned long long)));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(a));
        CHECK(cudaMemset(flag_a, 0, sizeof(unsigned long long)));
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaSetDevice(b));
        peer_pingpong<<<1, 32, 0, s_b>>>(flag_b, flag_a, 0, iters, elapsed_b);  // responder first
        CHECK(cudaSetDevice(a));
        peer_pingpong<<<1, 32, 0, s_a>>>(flag_a, flag_b, 1, iters, elapsed_a);
        if (!finish(s_a, 20.0) || !finish(s_b, 20.0)) {
            fail("peer_pingpong", "the two kernels did not run together (no answer in 20 s)", gpus);
            exit(3);  // a spinning kernel cannot be stopped; leaving the process ends it
        }
        if (round) {
            unsigned long long ns;
            CHECK(cudaMemcpy(&ns, elapsed_a, sizeof ns, cudaMemcpyDeviceToHost));
            report("peer_pingpong", 8, iters, ns / 1e3 / iters / 2, true, gpus);
        }
    }
    char *src, *dst;
    CHECK(cudaSetDevice(b));
    CHECK(cudaMalloc(&dst, MOST));
    CHECK(cudaSetDevice(a));
    CHECK(cudaMalloc(&src, MOST));
    fill(src, MOST, 7);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (size_t bytes : SIZES) {
        if (bytes % 16) continue;  // 16-byte words
        const long long n16 = bytes / 16;
        const int threads = 256;
        long long blocks = (n16 + threads - 1) / threads;
        if (blocks > 4LL * sms) blocks = 4LL * sms;
        const long long iters = iterations(bytes, 8e9, 20, 20000);
        CHECK(cudaMemset(dst, 0, bytes));
        CHECK(cudaDeviceSynchronize());
        peer_put_loop<<<(int)blocks, threads>>>((const int4*)src, (int4*)dst, n16, 2, elapsed_a);  // warm-up
        CHECK(cudaEventRecord(e0));
        peer_put_loop<<<(int)blocks, threads>>>((const int4*)src, (int4*)dst, n16, iters, elapsed_a);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        report("peer_put_loop", bytes, iters, ms * 1e3 / iters, same(src, dst, bytes), gpus);
    }
    CHECK(cudaFree(src));
    CHECK(cudaFree(flag_a));
    CHECK(cudaFree(elapsed_a));
    CHECK(cudaStreamDestroy(s_a));
    CHECK(cudaSetDevice(b));
    CHECK(cudaFree(dst));
    CHECK(cudaFree(flag_b));
    CHECK(cudaFree(elapsed_b));
    CHECK(cudaStreamDestroy(s_b));
    CHECK(cudaSetDevice(a));
}

// The peer loops on GPU 0, then between GPUs 0 and 1 where this process sees two.
static void all_peer_loops() {
    int count = 0;
    CHECK(cudaGetDeviceCount(&count));
    peer_loops(0, 0);
    if (count > 1) peer_loops(0, 1);
}

#ifdef XBENCH_WITH_NVSHMEM
static void nvshmem_probes(int sms) {
    const int me = nvshmem_my_pe(), npes = nvshmem_n_pes();
    const int peer = (me + 1) % npes;
    const int initiator = me == 0;
    char* dst = (char*)nvshmem_malloc(MOST);
    char* src = (char*)nvshmem_malloc(MOST);
    uint64_t* signal = (uint64_t*)nvshmem_malloc(sizeof(uint64_t));
    if (!dst || !src || !signal) {
        fail("nvshmem_malloc", "symmetric heap too small (NVSHMEM_SYMMETRIC_SIZE)");
        return;
    }
    unsigned long long* elapsed;
    CHECK(cudaMalloc(&elapsed, sizeof(unsigned long long)));
    fill(src, MOST, 11 + me);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    const char* where = npes == 1 ? "1 PE, to itself" : "2 PEs";
    printf("{\"nvshmem\": \"%s\", \"pe\": %d, \"npes\": %d}\n", where, me, npes);
    // who issues each latency-sized put: one thread, a warp, or a block (probe_device.cu)
    const char* scope_names[] = {"thread", "warp", "block"};
    const int scope_threads[] = {1, 32, 512};
    for (size_t bytes : SIZES) {
        for (int scope = 0; scope < 3 && bytes <= 65536; scope++) {
            char extra[64];
            snprintf(extra, sizeof extra, "\"scope\": \"%s\"", scope_names[scope]);
            // puts back to back, then quiet (PE 0 only; the peer waits)
            if (initiator) {
                const long long iters = iterations(bytes, 1e9, 10, 10000);
                CHECK(cudaMemset(dst, 0, bytes));
                nvshmem_barrier_all();
                nvshmem_put_loop<<<1, scope_threads[scope]>>>(dst, src, bytes, peer, scope, iters, elapsed);
                CHECK(cudaDeviceSynchronize());
                unsigned long long ns;
                CHECK(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
                const bool ok = npes > 1 || same(src, dst, bytes);  // two PEs: checked by the peer below
                report("nvshmem_put_loop", bytes, iters, ns / 1e3 / iters, ok, extra);
            } else {
                nvshmem_barrier_all();
            }
            nvshmem_barrier_all();
            // put-with-signal ping-pong
            const long long iters = iterations(bytes, 2e9, 10, 10000);
            CHECK(cudaMemset(signal, 0, sizeof(uint64_t)));
            CHECK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            nvshmem_putsig_pingpong<<<1, scope_threads[scope]>>>(dst, src, bytes, signal, peer, scope, initiator, 1,
                                                                 iters, elapsed);
            CHECK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            unsigned long long ns;
            CHECK(cudaMemcpy(&ns, elapsed, sizeof ns, cudaMemcpyDeviceToHost));
            if (initiator) report("nvshmem_putsig_pingpong", bytes, iters, ns / 1e3 / iters / 2, true, extra);
        }
        // bandwidth: every block puts its share. At the largest size both one block an SM (the
        // transport's grid) and four (the peer loop's, which copied 6x faster on an H200 in
        // session 43, where the NVSHMEM grid reached 320 GB/s): the run says which to keep.
        const int grids[] = {bytes < (1 << 20) ? 1 : (bytes < (16 << 20) ? 16 : sms), 4 * sms};
        for (int g = 0; g < (bytes == MOST ? 2 : 1); g++) {
            const int blocks = grids[g];
            char extra[64];
            snprintf(extra, sizeof extra, "\"scope\": \"block\", \"blocks\": %d", blocks);
            const long long iters = iterations(bytes, 8e9, 5, 2000);
            CHECK(cudaMemset(dst, 0, bytes));
            CHECK(cudaDeviceSynchronize());
            nvshmem_barrier_all();
            if (initiator) {
                CHECK(cudaEventRecord(e0));
                nvshmem_put_bw<<<blocks, 512>>>(dst, src, bytes, peer, iters);
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
            }
            nvshmem_barrier_all();
            if (initiator) {
                float ms;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                report("nvshmem_put_bw", bytes, iters, ms * 1e3 / iters, npes > 1 || same(src, dst, bytes), extra);
            } else if (npes > 1) {  // the bytes PE 0 put here are PE 0's pattern
                char* expect;
                CHECK(cudaMalloc(&expect, bytes));
                fill(expect, bytes, 11);
                if (!same(expect, dst, bytes)) fail("nvshmem_put_bw", "the bytes received differ from those sent");
                CHECK(cudaFree(expect));
            }
        }
    }
    nvshmem_barrier_all();
    CHECK(cudaFree(elapsed));
    nvshmem_free(dst);
    nvshmem_free(src);
    nvshmem_free(signal);
}
#endif

int main(int argc, char** argv) {
    bool only_peer = argc > 1 && strcmp(argv[1], "--peer-only") == 0;
    int device = 0, sms = 0;
#ifdef XBENCH_WITH_NVSHMEM
    const char* pes = getenv("XBENCH_NVSHMEM_PES");  // set by a launcher for two PEs
    if (!only_peer) {
        if (pes && atoi(pes) > 1) {
            nvshmem_init();  // NVSHMEM_BOOTSTRAP (PMI, PMIx, MPI) says how the PEs meet
            device = nvshmem_team_my_pe(NVSHMEMX_TEAM_NODE);
        } else {  // one PE: a unique id made here is the whole bootstrap
            CHECK(cudaSetDevice(0));
            nvshmemx_uniqueid_t id = NVSHMEMX_UNIQUEID_INITIALIZER;
            nvshmemx_get_uniqueid(&id);
            nvshmemx_init_attr_t attr = NVSHMEMX_INIT_ATTR_INITIALIZER;
            nvshmemx_set_attr_uniqueid_args(0, 1, &id, &attr);
            nvshmemx_init_attr(NVSHMEMX_INIT_WITH_UNIQUEID, &attr);
        }
    }
#endif
    CHECK(cudaSetDevice(device));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
#ifdef XBENCH_WITH_NVSHMEM
    if (!only_peer) {
        nvshmem_probes(sms);
        if (nvshmem_my_pe() == 0) peer_loops(device, device);
        nvshmem_finalize();
    } else {
        all_peer_loops();
    }
#else
    (void)only_peer;
    all_peer_loops();
#endif
    return failures ? 1 : 0;
}
