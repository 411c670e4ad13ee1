// How far this CPU overlaps streaming reads with compute, for the access orders a decode
// kernel can take (NOTES.md, "Decode, session 13"). A model of one decode work-group per core:
// a K and a V stream in flash-attn's (B, N, H, D) layout (a key's 8 heads x 256 B = 2 KB,
// bf16 d = 128), steps of 4 keys, key blocks of 32, 12 vector FMAs per 64-byte line consumed
// (about the decode kernel's instructions per line). Every mode reads the same bytes and does
// the same FMAs; only the order of reads and the reads ahead differ.
//
//   gcc -O2 -mavx512f -pthread scripts/stream_overlap.c -o /tmp/stream_overlap
//   /tmp/stream_overlap [results.txt]
//
// Prints, and writes to the file if given, the best time of each mode over interleaved rounds
// (the machine is shared and noisy: compare modes within one run only).
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { KEY_BYTES = 2048, HEAD_BYTES = 256, LINE = 64, STEP_KEYS = 4, BLOCK_KEYS = 32 };
enum { THREADS = 2, ROUNDS = 6 };
static const size_t KEYS = 65536;  // 128 MB of K and 128 MB of V per thread

typedef enum {
  COMPUTE_ONLY,    // every block re-reads the first block: the compute alone
  KERNEL_BURST,    // the CPU kernel: each step's K and V lines touched in one burst, then the
                   // scores head by head (4 keys each), P.V at the block's end head by head
  KERNEL_NO_BURST, // the same without the burst: every line read where it is used
  MEMORY_ORDER,    // each key's K line then V line of a head, in memory order, used at once
  PREFETCH_EACH,   // the kernel's order, and one prefetcht0 of the next block per line used
  PREFETCH_RUNS,   // the same prefetches issued a 2 KB run (32 lines) at a time, as one
                   // syclexp::prefetch call per run would
  MODES
} Mode;
static const char* NAMES[MODES] = {"compute only", "kernel, burst per step",
                                   "kernel, no burst", "memory order, used at once",
                                   "kernel + prefetch per line", "kernel + prefetch per run"};

typedef struct {
  const char* k;
  const char* v;
  Mode mode;
  float sink;
} Job;

typedef struct {
  __m512 acc[8];
  __m512 q;
  __m512i touched;
  const char* k;
  const char* v;
  size_t ahead, ahead_end;  // next line of the read-ahead (K and V alike), its limit
  int pending;              // lines used since the last run of prefetches
} State;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static inline void read_ahead(State* s, Mode mode) {
  if (mode == PREFETCH_EACH && s->ahead < s->ahead_end) {
    _mm_prefetch(s->k + s->ahead * LINE, _MM_HINT_T0);
    _mm_prefetch(s->v + s->ahead * LINE, _MM_HINT_T0);
    ++s->ahead;
  } else if (mode == PREFETCH_RUNS && ++s->pending == KEY_BYTES / LINE) {
    s->pending = 0;
    for (int i = 0; i < KEY_BYTES / LINE && s->ahead < s->ahead_end; ++i, ++s->ahead) {
      _mm_prefetch(s->k + s->ahead * LINE, _MM_HINT_T0);
      _mm_prefetch(s->v + s->ahead * LINE, _MM_HINT_T0);
    }
  }
}

static inline void use(State* s, const char* line, Mode mode) {
  read_ahead(s, mode);
  const __m512 x = _mm512_load_ps((const float*)line);
#pragma GCC unroll 12  // the accumulators must stay in registers
  for (int i = 0; i < 12; ++i) s->acc[i & 7] = _mm512_fmadd_ps(x, s->q, s->acc[i & 7]);
}

static inline void touch(State* s, const char* line) {
  s->touched = _mm512_xor_si512(s->touched, _mm512_load_si512((const void*)line));
}

static void* run(void* arg) {
  Job* job = arg;
  const Mode mode = job->mode;
  State s = {.q = _mm512_set1_ps(1.0001f), .touched = _mm512_setzero_si512(), .k = job->k,
             .v = job->v, .ahead_end = KEYS * KEY_BYTES / LINE};
  for (int i = 0; i < 8; ++i) s.acc[i] = _mm512_setzero_ps();
  for (size_t block = 0; block < KEYS; block += BLOCK_KEYS) {
    const size_t first = mode == COMPUTE_ONLY ? 0 : block * KEY_BYTES;
    const char* kb = job->k + first;
    const char* vb = job->v + first;
    s.ahead = (block + BLOCK_KEYS) * KEY_BYTES / LINE;  // the next block, from its start
    if (mode == MEMORY_ORDER) {
      for (int j = 0; j < BLOCK_KEYS; ++j)
        for (int h = 0; h < KEY_BYTES / HEAD_BYTES; ++h) {
          for (int l = 0; l < HEAD_BYTES / LINE; ++l) use(&s, kb + j * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
          for (int l = 0; l < HEAD_BYTES / LINE; ++l) use(&s, vb + j * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
        }
      continue;
    }
    for (int step = 0; step < BLOCK_KEYS; step += STEP_KEYS) {
      const char* k = kb + step * KEY_BYTES;
      if (mode == KERNEL_BURST)
        for (int j = 0; j < STEP_KEYS; ++j)
          for (int l = 0; l < KEY_BYTES / LINE; ++l) {
            touch(&s, k + j * KEY_BYTES + l * LINE);
            touch(&s, vb + (step + j) * KEY_BYTES + l * LINE);
          }
      for (int h = 0; h < KEY_BYTES / HEAD_BYTES; ++h)  // scores: a head's 4 keys at a time
        for (int l = 0; l < HEAD_BYTES / LINE; ++l)
          for (int j = 0; j < STEP_KEYS; ++j) use(&s, k + j * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
    }
    for (int h = 0; h < KEY_BYTES / HEAD_BYTES; ++h)  // P.V: a head's column pass over the block
      for (int l = 0; l < HEAD_BYTES / LINE; ++l)
        for (int j = 0; j < BLOCK_KEYS; ++j) use(&s, vb + j * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
  }
  float sum = (float)_mm512_reduce_add_epi32(s.touched);
  for (int i = 0; i < 8; ++i) sum += _mm512_reduce_add_ps(s.acc[i]);
  job->sink = sum;
  return NULL;
}

int main(int argc, char** argv) {
  const size_t bytes = KEYS * KEY_BYTES;
  char* k[THREADS];
  char* v[THREADS];
  for (int t = 0; t < THREADS; ++t) {
    k[t] = aligned_alloc(4096, bytes);
    v[t] = aligned_alloc(4096, bytes);
    memset(k[t], 1, bytes);
    memset(v[t], 1, bytes);
  }
  double best[MODES];
  for (int m = 0; m < MODES; ++m) best[m] = 1e9;
  for (int round = 0; round < ROUNDS; ++round)
    for (int m = 0; m < MODES; ++m) {
      pthread_t threads[THREADS];
      Job jobs[THREADS];
      const double start = now();
      for (int t = 0; t < THREADS; ++t) {
        jobs[t] = (Job){k[t], v[t], (Mode)m, 0.f};
        pthread_create(&threads[t], NULL, run, &jobs[t]);
      }
      for (int t = 0; t < THREADS; ++t) pthread_join(threads[t], NULL);
      const double seconds = now() - start;
      if (seconds < best[m]) best[m] = seconds;
    }
  FILE* out = argc > 1 ? fopen(argv[1], "w") : NULL;
  for (int m = 0; m < MODES; ++m) {
    char line[160];
    snprintf(line, sizeof line, "%-28s %8.2f ms  %6.1f GB/s read  %5.2fx the burst\n", NAMES[m],
             best[m] * 1e3, 2.0 * THREADS * bytes / best[m] / 1e9, best[KERNEL_BURST] / best[m]);
    fputs(line, stdout);
    if (out) fputs(line, out);
  }
  if (out) fclose(out);
  return 0;
}
