// baseline.cu — CUDA's own submission path, for the comparison benchmarks
// (crates/cuda/src/baseline.rs). These kernels are what a CUDA program does without doorbell:
// launch a kernel per piece of work, or keep one running that polls a word in host memory.
//
// Self-contained: NVRTC has no standard headers, so this file includes nothing. Every kernel
// is `extern "C"` so the host finds it by its plain name.
//
// Host memory here is pinned and mapped (cuMemHostAlloc with DEVICEMAP): the GPU reaches it
// over PCIe. A volatile access to it is a PTX `ld/st.volatile`, which the PTX memory model
// treats as a relaxed access at system scope: it always goes to memory (no caching in L1),
// so a polling loop sees the CPU's stores and the CPU sees ours.

typedef unsigned long long u64;
typedef unsigned int u32;

// The GPU's nanosecond clock (the same time base on every SM).
__device__ __forceinline__ u64 globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ bool first_thread() {
    return threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0 && blockIdx.x == 0 && blockIdx.y == 0 &&
           blockIdx.z == 0;
}

// The CUDA launch round trip: the CPU launches this (one thread) and spins until it sees
// `value` in the pinned host word `flag`.
extern "C" __global__ void probe_flag(u64* flag, u64 value) {
    if (first_thread()) {
        *(volatile u64*)flag = value;
        __threadfence_system();
    }
}

// The same through a graph, whose arguments are fixed at capture: each run writes one more
// than the last to `flag`. The count lives in device memory (`counter`, zeroed before the
// first run), so the kernel makes no PCIe read, only the one PCIe write probe_flag makes.
extern "C" __global__ void probe_increment(u64* flag, u64* counter) {
    if (first_thread()) {
        u64 v = *counter + 1;
        *counter = v;
        *(volatile u64*)flag = v;
        __threadfence_system();
    }
}

// Does nothing: launch throughput.
extern "C" __global__ void empty_kernel() {}

// A low-priority load that fills the GPU: launch 2 blocks of 1024 threads per SM. Every
// thread spins until `ns` nanoseconds of the GPU clock have passed since its block started,
// or until the host sets `*stop`; thread 0 reads `stop` (over PCIe) about once a microsecond
// and tells the others through shared memory. `__launch_bounds__(1024, 2)` keeps register
// use low enough (32 per thread) for two such blocks to be resident on one SM.
extern "C" __global__ void __launch_bounds__(1024, 2) spin_blocks(u64 ns, const volatile u32* stop) {
    __shared__ u64 start;
    __shared__ volatile u32 quit;
    if (threadIdx.x == 0) {
        start = globaltimer();
        quit = *stop;
    }
    __syncthreads();
    const u64 begin = start;
    u64 polled = begin;
    for (;;) {
        u64 now = globaltimer();
        if (now - begin >= ns || quit != 0) {
            break;
        }
        if (threadIdx.x == 0 && now - polled >= 1000) {
            polled = now;
            if (*stop != 0) {
                quit = 1;
            }
        }
    }
}

// The PCIe floor of a doorbell whose consumer is on the GPU: one persistent thread polls the
// pinned host word `doorbell`; each new value it sees is written back to `ack`. The host
// writes only non-zero, increasing values, so the starting value 0 is never acknowledged.
// `quit` is read about once a millisecond (each read is a PCIe round trip, which would
// otherwise slow every poll of the doorbell); the kernel exits once it is non-zero.
extern "C" __global__ void doorbell_echo(const volatile u64* doorbell, volatile u64* ack, const volatile u32* quit) {
    if (!first_thread()) {
        return;
    }
    u64 last = 0;
    u64 checked = globaltimer();
    for (;;) {
        u64 v = *doorbell;
        if (v != last) {
            last = v;
            *ack = v;
            __threadfence_system();
        }
        u64 now = globaltimer();
        if (now - checked >= 1000000) {
            checked = now;
            if (*quit != 0) {
                return;
            }
        }
    }
}

// What one thread's accesses to host memory cost (for tuning the engine program): `n`
// accesses to consecutive 8-byte words of `dst`, timed on the GPU's clock, the ns written to
// `out`. mode 0: volatile stores; 1: write-through stores (st.global.wt); 2: plain stores,
// then one system fence; 3: volatile stores, each followed by a system fence; 4: volatile
// loads, each used before the next.
extern "C" __global__ void access_cost(u64* dst, u64 n, u32 mode, volatile u64* out) {
    if (!first_thread()) return;
    u64 sum = 0;
    u64 t0 = globaltimer();
    for (u64 i = 0; i < n; ++i) {
        if (mode == 0) {
            *(volatile u64*)(dst + i) = i;
        } else if (mode == 1) {
            asm volatile("st.global.wt.u64 [%0], %1;" ::"l"(dst + i), "l"(i) : "memory");
        } else if (mode == 2) {
            dst[i] = i;
        } else if (mode == 3) {
            *(volatile u64*)(dst + i) = i;
            __threadfence_system();
        } else {
            sum += *(volatile u64*)(dst + (sum & 1) + i);
        }
    }
    if (mode == 2) __threadfence_system();
    u64 t1 = globaltimer();
    out[0] = t1 - t0;
    out[1] = sum;
    __threadfence_system();
}
