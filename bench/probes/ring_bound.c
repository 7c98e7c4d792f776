/* What a compiled 2-rank ring all-reduce (float32 sum) can reach on this machine, against a lone
 * memcpy (numpy.copyto's glibc memcpy), and a 2-rank tree against it: the bounds behind issue
 * 6's ring/copy and tree/ring targets.
 *
 * Two processes (fork), each with its own input x and output y of S bytes (or, for the
 * "shared" variants, vectors in one shared mapping, like algorithms.alloc_registered). Each
 * rank reduces its half in pieces of P bytes and the other rank's reduced half reaches it,
 * as in the 2-rank ring (algorithms/catalog/ring.py). The variants differ in what NumPy cannot do:
 * non-temporal stores (which skip the read for ownership of each destination line) and fused
 * kernels (a piece reduced in L2 and streamed out). Private vectors can only cross between
 * processes through the kernel (CMA: process_vm_readv/writev, as MPICH does) or through
 * shared memory that the sender first copies into (the slots of algorithms.shared_memory).
 *
 * The 2-rank tree (one root reducing everything, the other rank copying the result) is timed
 * the same ways, for the tree/ring target.
 *
 * Usage: ring_bound SIZE_BYTES PIECE_BYTES REPETITIONS. The variants are timed in turn within
 * each repetition; prints one tab-separated line per variant: its name, then its time in
 * seconds in each repetition (bench/bound.py takes the ratios repetition by repetition). Every
 * variant's result is checked against the closed form of the sum; a wrong one makes the exit
 * status 1. Build: cc -O2 -march=native ring_bound.c (x86-64).
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_REPS 101
#define LINE 64

typedef struct {
  atomic_long barrier[2], sent[2], reduced[2], consumed[2];
  float *x[2], *y[2];
  pid_t pid[2];
} control_t;

static control_t *ctl;
static int me;
static long generation;

static pid_t child;

/* Spin until *flag reaches value; a rank whose peer has died exits instead of spinning on. */
static void wait_for(atomic_long *flag, long value) {
  for (unsigned long spins = 1; atomic_load(flag) < value; spins++)
    if (spins % (1UL << 22) == 0 && (me ? getppid() == 1 : waitpid(child, 0, WNOHANG) != 0)) {
      fprintf(stderr, "the other rank is gone\n");
      exit(1);
    }
}

static void barrier(void) {
  generation++;
  atomic_store(&ctl->barrier[me], generation);
  wait_for(&ctl->barrier[1 - me], generation);
}

static int right_at(const float *out, size_t i) { return out[i] == 2 * (float)(i % 1000) + 1; }

/* Whether out holds the sum: its first and last lines (cleared before each variant) and every
 * 4099th element in between, against the closed form of the inputs. */
static int summed(const float *out, size_t n) {
  size_t edge = LINE / 4; /* n >= 2 * edge: a piece is at least a line, the vector two pieces */
  for (size_t i = 0; i < edge; i++)
    if (!right_at(out, i) || !right_at(out, n - 1 - i)) return 0;
  for (size_t i = edge; i < n - edge; i += 4099)
    if (!right_at(out, i)) return 0;
  return 1;
}

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void die(const char *what) { perror(what); exit(2); }

/* The kernel's copy between the two processes (CMA): read the peer's memory, or write it. */
static void cma(int write, void *local, void *remote, size_t n) {
  struct iovec l = {local, n}, r = {remote, n};
  pid_t peer = ctl->pid[1 - me];
  ssize_t moved = write ? process_vm_writev(peer, &l, 1, &r, 1, 0) : process_vm_readv(peer, &l, 1, &r, 1, 0);
  if (moved != (ssize_t)n) die("process_vm_readv/writev");
}

/* One 64-byte line at a time, in the widest vectors the compiler was allowed (-march=native):
 * with 16-byte SSE stores the non-temporal copy ran at 0.7x glibc's at 256 MiB, with 64-byte
 * AVX-512 ones at 0.94x. */
#if defined(__AVX512F__)
#define PER_LINE 1
#define LOAD _mm512_loadu_ps
#define STORE _mm512_storeu_ps
#define STREAM _mm512_stream_ps
#define ADD _mm512_add_ps
#elif defined(__AVX__)
#define PER_LINE 2
#define LOAD _mm256_loadu_ps
#define STORE _mm256_storeu_ps
#define STREAM _mm256_stream_ps
#define ADD _mm256_add_ps
#else
#define PER_LINE 4
#define LOAD _mm_loadu_ps
#define STORE _mm_storeu_ps
#define STREAM _mm_stream_ps
#define ADD _mm_add_ps
#endif
#define STEP (LINE / 4 / PER_LINE) /* floats per vector */

static void add(float *o, const float *a, const float *b, size_t n) {
#pragma GCC unroll 4
  for (size_t i = 0; i < n; i += STEP) STORE(o + i, ADD(LOAD(a + i), LOAD(b + i)));
}
static void add_stream(float *o, const float *a, const float *b, size_t n) {
#pragma GCC unroll 4
  for (size_t i = 0; i < n; i += STEP) STREAM(o + i, ADD(LOAD(a + i), LOAD(b + i)));
}
static void copy_stream(float *o, const float *a, size_t n) {
#pragma GCC unroll 4
  for (size_t i = 0; i < n; i += STEP) STREAM(o + i, LOAD(a + i));
}

static float *vector(size_t bytes, int shared) {
  void *p = shared ? mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0)
                   : mmap(0, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) die("mmap");
  madvise(p, bytes, MADV_HUGEPAGE);  /* as NumPy advises its large arrays */
  return p;
}

enum { COPY, COPY_STREAM, CMA_PLAIN, CMA_STREAM, CMA_PUSH, SLOTS_STREAM, SHARED_PLAIN, SHARED_FUSED, TREE_PLAIN, TREE_STREAM, VARIANTS };
static const char *names[VARIANTS] = {
    "copy",          /* rank 0 alone: memcpy(y, x), glibc's (non-temporal from its threshold) */
    "copy_stream",   /* rank 0 alone: a non-temporal copy */
    "cma_plain",     /* private: CMA the peer's piece into L2, add into y, CMA the peer's reduced half into y (a NumPy ring over MPI) */
    "cma_stream",    /* private: as cma_plain with non-temporal stores into y, the all-gather through L2 */
    "cma_push",      /* private: CMA the peer's piece, add in L2, stream into y, CMA-write it into the peer's y */
    "slots_stream",  /* private: each piece copied into a shared slot, reduced into a second slot, streamed into both y */
    "shared_plain",  /* shared vectors: add both inputs into y, copy it into the peer's y, ordinary stores (the registered ring) */
    "shared_fused",  /* shared vectors: add both inputs in L2, stream into both y (a copy's traffic) */
    "tree_plain",    /* private: the 2-rank tree, pipelined: rank 0 reduces every piece as cma_plain, rank 1 CMA-reads it */
    "tree_stream",   /* private: the same with non-temporal stores into y, rank 1's copy through L2 */
};

int main(int argc, char **argv) {
  if (argc != 4) { fprintf(stderr, "usage: %s SIZE_BYTES PIECE_BYTES REPETITIONS\n", argv[0]); return 2; }
  size_t bytes = strtoull(argv[1], 0, 10), piece = strtoull(argv[2], 0, 10);
  int reps = atoi(argv[3]);
  if (piece == 0 || piece % LINE || bytes % (2 * piece)) {
    fprintf(stderr, "the piece (%zu) must be a multiple of %d bytes and divide half of the size (%zu)\n", piece, LINE, bytes);
    return 2;
  }
  if (reps < 1 || reps > MAX_REPS) { fprintf(stderr, "repetitions must be 1..%d\n", MAX_REPS); return 2; }
  size_t n = bytes / 4, half = n / 2, pn = piece / 4;

  ctl = (control_t *)vector(sizeof *ctl, 1);
  float *shared_x[2], *shared_y[2], *slot[2][2][2]; /* slot[rank][parity][0: input piece, 1: reduced piece] */
  for (int r = 0; r < 2; r++) {
    shared_x[r] = vector(bytes, 1);
    shared_y[r] = vector(bytes, 1);
    for (int p = 0; p < 2; p++)
      for (int k = 0; k < 2; k++) slot[r][p][k] = vector(piece, 1);
  }
  child = fork();
  if (child < 0) die("fork");
  me = child == 0;
  ctl->pid[me] = getpid();
  float *x = vector(bytes, 0), *y = vector(bytes, 0), *tmp = aligned_alloc(LINE, piece);
  if (!tmp) die("aligned_alloc");
  for (size_t i = 0; i < n; i++) x[i] = shared_x[me][i] = (float)(i % 1000) + me;
  memset(y, 0, bytes);
  memset(shared_y[me], 0, bytes);
  ctl->x[me] = x;
  ctl->y[me] = y;
  barrier();
  float *peer_x = ctl->x[1 - me], *peer_y = ctl->y[1 - me];
  float *sx = shared_x[me], *sy = shared_y[me], *peer_sx = shared_x[1 - me], *peer_sy = shared_y[1 - me];
  size_t mine = me * half, theirs = (1 - me) * half;
  static double t[VARIANTS][MAX_REPS];
  const char *wrong = 0; /* the first variant whose result this rank found wrong */

  for (int rep = 0; rep < reps; rep++)
    for (int v = 0; v < VARIANTS; v++) {
      float *out = v == SHARED_PLAIN || v == SHARED_FUSED ? sy : y;
      memset(out, 0, LINE);
      memset(out + n - LINE / 4, 0, LINE);
      ctl->sent[me] = ctl->reduced[me] = ctl->consumed[me] = 0;
      barrier();
      double t0 = now();
      switch (v) {
        case COPY: if (me == 0) memcpy(y, x, bytes); break;
        case COPY_STREAM: if (me == 0) copy_stream(y, x, n); break;
        case CMA_PLAIN: case CMA_STREAM: case CMA_PUSH:
          for (size_t o = mine; o < mine + half; o += pn) {
            cma(0, tmp, peer_x + o, piece);
            if (v == CMA_PLAIN) add(y + o, x + o, tmp, pn);
            else if (v == CMA_STREAM) add_stream(y + o, x + o, tmp, pn);
            else { add(tmp, x + o, tmp, pn); copy_stream(y + o, tmp, pn); cma(1, tmp, peer_y + o, piece); }
          }
          _mm_sfence();
          barrier();  /* the peer's half is reduced */
          if (v == CMA_PLAIN) cma(0, y + theirs, peer_y + theirs, half * 4);
          else if (v == CMA_STREAM)
            for (size_t o = theirs; o < theirs + half; o += pn) { cma(0, tmp, peer_y + o, piece); copy_stream(y + o, tmp, pn); }
          break;
        case SLOTS_STREAM:
          for (long i = 0; (size_t)i * pn < half; i++) {
            size_t o = i * pn;
            int p = i & 1;
            wait_for(&ctl->consumed[1 - me], i - 1); /* the peer is done with these slots' last use */
            memcpy(slot[me][p][0], x + theirs + o, piece);
            atomic_store(&ctl->sent[me], i + 1);
            wait_for(&ctl->sent[1 - me], i + 1);
            add(slot[me][p][1], x + mine + o, slot[1 - me][p][0], pn);
            atomic_store(&ctl->reduced[me], i + 1);
            copy_stream(y + mine + o, slot[me][p][1], pn);
            wait_for(&ctl->reduced[1 - me], i + 1);
            copy_stream(y + theirs + o, slot[1 - me][p][1], pn);
            atomic_store(&ctl->consumed[me], i + 1);
          }
          break;
        case SHARED_PLAIN:
          for (size_t o = mine; o < mine + half; o += pn) {
            add(sy + o, sx + o, peer_sx + o, pn);
            memcpy(peer_sy + o, sy + o, piece);
          }
          break;
        case TREE_PLAIN: case TREE_STREAM:
          for (long i = 0; (size_t)i * pn < n; i++) {
            size_t o = i * pn;
            if (me == 0) {
              cma(0, tmp, peer_x + o, piece);
              if (v == TREE_PLAIN) add(y + o, x + o, tmp, pn);
              else { add_stream(y + o, x + o, tmp, pn); _mm_sfence(); }
              atomic_store(&ctl->reduced[0], i + 1);
            } else {
              wait_for(&ctl->reduced[0], i + 1);
              if (v == TREE_PLAIN) cma(0, y + o, peer_y + o, piece);
              else { cma(0, tmp, peer_y + o, piece); copy_stream(y + o, tmp, pn); }
            }
          }
          break;
        case SHARED_FUSED:
          for (size_t o = mine; o < mine + half; o += pn) {
            add(tmp, sx + o, peer_sx + o, pn);
            copy_stream(sy + o, tmp, pn);
            copy_stream(peer_sy + o, tmp, pn);
          }
          break;
      }
      _mm_sfence();
      barrier();
      t[v][rep] = now() - t0;
      if (v != COPY && v != COPY_STREAM && !summed(out, n) && !wrong) wrong = names[v];
    }

  if (wrong) { fprintf(stderr, "rank %d: %s: wrong sum\n", me, wrong); }
  if (me == 0) {
    for (int v = 0; v < VARIANTS; v++) {
      printf("%s", names[v]);
      for (int r = 0; r < reps; r++) printf("\t%.9f", t[v][r]);
      printf("\n");
    }
    fflush(stdout);
    int status;
    if (waitpid(child, &status, 0) < 0 || !WIFEXITED(status)) return 1;
    return wrong || WEXITSTATUS(status) ? 1 : 0;
  }
  return wrong ? 1 : 0;
}
