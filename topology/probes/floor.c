/* The least latency and the fastest copy this machine allows, for the lower bound of any
 * all-reduce (topology/model/lower_bound.py); topology/floor.py builds it with the MPI's own
 * mpicc (mpicc -O2 -shared -fPIC -o LIB floor.c) and calls it through ctypes.
 *
 * - floor_pingpong: a 1-byte MPI_Send/MPI_Recv ping-pong with a peer, timed in C (no Python
 *   between the messages): the least round trip of `reps`.
 * - floor_flag: two processes spinning on two cache lines of shared memory (a window of
 *   MPI_Win_allocate_shared): the leader stores a count into its line and waits for the
 *   follower to store it back into the other; the least round trip of `reps`. No transport
 *   tells a rank of a peer's store sooner than the cache line itself.
 * - floor_copy: the fastest copy of `nbytes` (memcpy, and on x86 non-temporal stores), each
 *   timed over a batch of back-to-back copies of the same buffers (hot in the caches where they
 *   fit): bytes over the least time of one copy.
 *
 * Every time is CLOCK_MONOTONIC. A spin that outlasts SPIN_SECONDS returns -1 (the peer is gone).
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SPIN_SECONDS 30.0
#define BATCH_SECONDS 20e-6 /* a timed batch of copies lasts at least this long: far above the clock's step */

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int floor_pingpong(MPI_Fint comm_f, int peer, int leads, int warmup, int reps, double *best)
{
    MPI_Comm comm = MPI_Comm_f2c(comm_f);
    char byte = 1;
    double least = 1e30;
    for (int i = 0; i < warmup + reps; i++) {
        double start = now();
        int rc;
        if (leads) {
            rc = MPI_Send(&byte, 1, MPI_BYTE, peer, 12, comm);
            if (rc == MPI_SUCCESS) rc = MPI_Recv(&byte, 1, MPI_BYTE, peer, 12, comm, MPI_STATUS_IGNORE);
        } else {
            rc = MPI_Recv(&byte, 1, MPI_BYTE, peer, 12, comm, MPI_STATUS_IGNORE);
            if (rc == MPI_SUCCESS) rc = MPI_Send(&byte, 1, MPI_BYTE, peer, 12, comm);
        }
        if (rc != MPI_SUCCESS) return rc;
        double took = now() - start;
        if (i >= warmup && took < least) least = took;
    }
    *best = least;
    return 0;
}

/* Spin until *line holds value; 0, or -1 after SPIN_SECONDS. */
static int wait_for(_Atomic long *line, long value)
{
    double began = 0;
    for (unsigned long spins = 1; atomic_load_explicit(line, memory_order_acquire) != value; spins++) {
        if (spins % (1UL << 10) == 0) sched_yield(); /* more ranks than cores: let the peer run */
        if (spins % (1UL << 20) == 0) {
            if (began == 0) began = now();
            else if (now() - began > SPIN_SECONDS) return -1;
        }
    }
    return 0;
}

/* `lines`: two 64-byte lines of shared memory (ping at 0, pong at 64), both ranks' mapping of
 * them; `base`: larger than any count stored in them before. */
int floor_flag(void *lines, long base, int leads, int warmup, int reps, double *best)
{
    _Atomic long *ping = (_Atomic long *)lines, *pong = (_Atomic long *)((char *)lines + 64);
    double least = 1e30;
    for (int i = 1; i <= warmup + reps; i++) {
        long value = base + i;
        if (leads) {
            double start = now();
            atomic_store_explicit(ping, value, memory_order_release);
            if (wait_for(pong, value)) return -1;
            double took = now() - start;
            if (i > warmup && took < least) least = took;
        } else {
            if (wait_for(ping, value)) return -1;
            atomic_store_explicit(pong, value, memory_order_release);
        }
    }
    *best = leads ? least : 0.0;
    return 0;
}

static void stream_copy(char *to, const char *from, size_t n)
{
#if defined(__SSE2__)
    size_t i = 0;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(from + i)), b = _mm_loadu_si128((const __m128i *)(from + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(from + i + 32)), d = _mm_loadu_si128((const __m128i *)(from + i + 48));
        _mm_stream_si128((__m128i *)(to + i), a);
        _mm_stream_si128((__m128i *)(to + i + 16), b);
        _mm_stream_si128((__m128i *)(to + i + 32), c);
        _mm_stream_si128((__m128i *)(to + i + 48), d);
    }
    _mm_sfence();
    memcpy(to + i, from + i, n - i);
#else
    memcpy(to, from, n);
#endif
}

/* The least time (s) of one copy of n bytes by `stream` or memcpy: batches of copies, each batch
 * at least BATCH_SECONDS, at least `least` batches and `seconds` of them. */
static double fastest(char *to, const char *from, size_t n, int stream, int least, double seconds)
{
    double best = 1e30, began = now();
    long per_batch = 1;
    for (int batch = 0; batch < least || now() - began < seconds; batch++) {
        double start = now();
        for (long k = 0; k < per_batch; k++) {
            if (stream) stream_copy(to, from, n);
            else memcpy(to, from, n);
            __asm__ __volatile__("" ::: "memory"); /* every copy happens */
        }
        double took = now() - start;
        if (took < BATCH_SECONDS && per_batch < (1L << 24)) {
            per_batch *= 2;
            batch--; /* too short to time: again with twice as many */
            continue;
        }
        if (took / per_batch < best) best = took / per_batch;
    }
    return best;
}

/* Bytes per second of the fastest copy of nbytes (memcpy or non-temporal); -1 without memory. */
double floor_copy(size_t nbytes, int least, double seconds)
{
    char *from = aligned_alloc(64, (nbytes + 63) / 64 * 64), *to = aligned_alloc(64, (nbytes + 63) / 64 * 64);
    if (!from || !to) { free(from); free(to); return -1; }
    memset(from, 1, nbytes);
    memset(to, 2, nbytes);
    double best = fastest(to, from, nbytes, 0, least, seconds);
    double streamed = fastest(to, from, nbytes, 1, least, seconds);
    free(from);
    free(to);
    return nbytes / (streamed < best ? streamed : best);
}
