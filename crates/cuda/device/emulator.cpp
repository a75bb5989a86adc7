// The engine program built for the CPU (see common.cuh): the emulated backend.
#include <time.h>
extern "C" unsigned long long db_host_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}
#include "engine.cu"
