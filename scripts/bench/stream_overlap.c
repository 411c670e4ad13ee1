// How far this CPU overlaps streaming reads with compute, for the access orders a decode
// kernel can take (docs/cpu_device.md, "Decode on the CPU device"). A model of one decode
// work-group per core: a K and a V stream in flash-attn's (B, N, H, D) layout (a key's 8 heads
// x 256 B = 2 KB, bf16 d = 128), steps of 4 keys, key blocks of 32 (64 in the step-by-step
// modes, as the kernel's key streams), 12 vector FMAs per 64-byte line consumed
// (about the decode kernel's instructions per line). Every mode reads the same bytes and does
// the same FMAs; only the order of reads and the reads ahead differ.
//
//   gcc -O2 -mavx512f -pthread scripts/bench/stream_overlap.c -o /tmp/stream_overlap
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
enum { STEP_BLOCK_KEYS = 64 };  // the step-by-step modes' blocks: as the kernel's key streams
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
  LOAD_EACH,       // the kernel's order, and one demand load of the next block per line used
  STEP_PV,         // no burst, P.V step by step over the heads too (the step's 4 keys side
                   // by side, two to a 4 KB page)
  PAGE_APART,      // the same, a step's keys a page apart (keys t%2 + 2j + 8(t/2) of a block)
  STREAMS,         // key streams (decode_streams.hpp): step t takes the t-th key of each of 4
                   // quarters of the keys; scores then P.V, both step by step, no burst
  STREAMS_KV,      // the same, each head's V rows used right after its K rows
  STREAMS_HEAD_PV, // key streams for the scores, P.V head by head over the block
  MODES
} Mode;
static const char* NAMES[MODES] = {"compute only", "kernel, burst per step",
                                   "kernel, no burst", "memory order, used at once",
                                   "kernel + prefetch per line", "kernel + prefetch per run",
                                   "kernel + load per line", "P.V step-major, no burst",
                                   "step's keys a page apart", "key streams",
                                   "key streams, K by V", "key streams, P.V by head"};

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
  } else if (mode == LOAD_EACH && s->ahead < s->ahead_end) {
    s->touched = _mm512_xor_si512(s->touched, _mm512_load_si512((const void*)(s->k + s->ahead * LINE)));
    s->touched = _mm512_xor_si512(s->touched, _mm512_load_si512((const void*)(s->v + s->ahead * LINE)));
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

// One block of the step-by-step modes: STEP_BLOCK_KEYS keys in steps of STEP_KEYS, key (t, j) at
// base + key(t, j) * KEY_BYTES; each step's K rows head by head, with V after each head
// (by_head_v) or in a step-major P.V pass after the scores, or a head-major one (head_pv).
// (Inlined, so that the accumulators stay in registers as in the other modes.)
static inline __attribute__((always_inline)) void step_block(
    State* s, const char* kb, const char* vb, size_t (*key)(int, int), int by_head_v, int head_pv,
    Mode mode) {
  enum { STEPS = STEP_BLOCK_KEYS / STEP_KEYS, HEADS = KEY_BYTES / HEAD_BYTES, LINES = HEAD_BYTES / LINE };
  for (int t = 0; t < STEPS; ++t)
    for (int h = 0; h < HEADS; ++h) {
      for (int l = 0; l < LINES; ++l)
        for (int j = 0; j < STEP_KEYS; ++j) use(s, kb + key(t, j) * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
      if (by_head_v)
        for (int l = 0; l < LINES; ++l)
          for (int j = 0; j < STEP_KEYS; ++j) use(s, vb + key(t, j) * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
    }
  if (by_head_v) return;
  for (int o = 0; o < STEPS * HEADS; ++o) {  // step-major (t, h) or head-major (h, t)
    const int t = head_pv ? o % STEPS : o / HEADS, h = head_pv ? o / STEPS : o % HEADS;
    for (int l = 0; l < LINES; ++l)
      for (int j = 0; j < STEP_KEYS; ++j) use(s, vb + key(t, j) * KEY_BYTES + h * HEAD_BYTES + l * LINE, mode);
  }
}

static inline size_t side_by_side(int t, int j) { return (size_t)(t * STEP_KEYS + j); }
static inline size_t page_apart(int t, int j) {
  enum { PER_PAGE = 4096 / KEY_BYTES };
  return (size_t)(t % PER_PAGE + PER_PAGE * j + PER_PAGE * STEP_KEYS * (t / PER_PAGE));
}
static inline size_t quarters(int t, int j) { return (size_t)t + (size_t)j * (KEYS / STEP_KEYS); }

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
    if (mode >= STEP_PV && block % STEP_BLOCK_KEYS != 0) continue;  // blocks of their own size
    if (mode == STEP_PV || mode == PAGE_APART) {
      if (mode == STEP_PV) step_block(&s, kb, vb, side_by_side, 0, 0, mode);
      else step_block(&s, kb, vb, page_apart, 0, 0, mode);
      continue;
    }
    if (mode == STREAMS || mode == STREAMS_KV || mode == STREAMS_HEAD_PV) {
      // This block: the next STEP_BLOCK_KEYS / STEP_KEYS keys of each quarter.
      const size_t first = block / STEP_KEYS * KEY_BYTES;
      step_block(&s, job->k + first, job->v + first, quarters, mode == STREAMS_KV,
                 mode == STREAMS_HEAD_PV, mode);
      continue;
    }
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
