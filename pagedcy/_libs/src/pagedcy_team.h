/* A team of threads that stays awake through a decode step (pagedcy._libs._team).
 *
 * Why: a decode step is some sixty short parallel regions (each projection and attention
 * call, 50 us to a few ms) with serial work between them. Under pagedcy's OpenMP wait policy
 * (a short spin, then sleep: what keeps NumPy's BLAS threads and pagedcy's from fighting) the
 * threads slept ~9 (thread 0, at region ends) and ~13-22 (the worker) times a token of
 * llama-3.2-1b Q4_K_M (voluntary context switches, AMD EPYC Zen 5 VM, 2 threads), and each
 * wake costs tens of microseconds, more on a busy host. A longer spin for the whole process
 * (GOMP_SPINCOUNT=30000) removed the sleeps but made a NumPy program that calls pagedcy
 * between its matmuls 1.7x slower (asv_benches/interleave.py). So the spin is scoped:
 * _team.run_in_team holds one OpenMP region open for a step; thread 0 runs the Python forward
 * pass in it and the others spin here, on a job word, until thread 0 posts a kernel's job (the
 * split the kernel's own region would use: the same bits) or ends the step. With it, one sleep
 * a token (between steps); single-sequence decode, same process, alternating, median of 4-6
 * runs: llama-3.2-1b Q4_K_M 39.9 -> 43.7 tok/s, gemma3-270m Q4_K_M 103 -> 118, Q8_0 on the
 * AVX2 kernels 91 -> 101, qwen2.5-0.5b Q8_0 61.7 -> 63.4, bf16 safetensors 33.2 -> 33.9.
 *
 * One team per step, posted to and waited on by thread 0 only. Jobs return nothing: a job
 * records its errors in its own argument.
 *
 * Tried and dropped (AMD EPYC Zen 4, family 25 model 17, 2 threads, 2026-12-04): the waiting
 * helper prefetching the next projection's weight (prefetcht1, 8 lines between looks at the
 * job word, up to 2 MiB a hint) while thread 0 ran the serial work before it. Alone, a cold
 * gemma3-270m Q4_K_M projection after a full read-ahead ran ~25% faster (w_o 23.1 -> 17.6 us,
 * gate|up 68.2 -> 49.6; with its bytes already in both cores' caches 12.5 and 29.8), and in
 * decode the helper read ~29 of the 68 MB of layer weights a token ahead. But decode itself,
 * one engine with the hint toggled between alternating rounds, was 1.005x (mean of 40 rounds,
 * sem 0.010; best round slower with it, 7.56 vs 6.80 ms a token); hinting two weights ahead
 * 1.003x; qwen2.5-0.5b Q4_K_M 1.001x. */
#ifndef PAGEDCY_TEAM_H
#define PAGEDCY_TEAM_H

#include <sched.h>
#include <stdatomic.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAGEDCY_TEAM_PAUSE() _mm_pause()
#else
#define PAGEDCY_TEAM_PAUSE() ((void)0)
#endif

typedef void (*pagedcy_team_fn)(void *arg, int t, int nt);

typedef struct {
    atomic_uint gen;      /* bumped to post a job or the end of the step */
    atomic_int done;      /* threads other than 0 done with the current job */
    atomic_int stop;
    pagedcy_team_fn fn;
    void *arg;
    int nt;
} pagedcy_team;

/* Spins between checks before a waiting thread also yields its core: a thread 0 that holds
 * the GIL in Python for long (a slow callback) then costs little. ~0.5-2 ms of pause. */
#define PAGEDCY_TEAM_SPINS (1 << 14)

/* What a job's threads share: the next unclaimed index of a dynamic loop, error codes. */
static inline long long pagedcy_claim(long long *next) { return __atomic_fetch_add(next, 1, __ATOMIC_RELAXED); }
static inline void pagedcy_atomic_or(int *p, int v) { __atomic_fetch_or(p, v, __ATOMIC_RELAXED); }

/* How a job's threads share [0, total) units of work: chunk 0, thread t's fixed share
 * [total t / nt, total (t + 1) / nt); else chunks of `chunk` units claimed in turn (next: the
 * next unclaimed chunk, 0 at the start). _team.pyx's split_of says when. */
typedef struct { int total, chunk; long long next; } pagedcy_split;

/* Thread t's next range [*a, *b) of s (state: 0 before its first call); 0 when it has none. */
static inline int pagedcy_split_next(pagedcy_split *s, int t, int nt, int *state, int *a, int *b) {
    if (s->chunk <= 0) {
        if ((*state)++) return 0;
        *a = (int)((long long)s->total * t / nt);
        *b = (int)((long long)s->total * (t + 1) / nt);
        return *a < *b;
    }
    const long long c = pagedcy_claim(&s->next);
    if (c >= (s->total + (long long)s->chunk - 1) / s->chunk) return 0;
    *a = (int)(c * s->chunk);
    *b = s->total - *a < s->chunk ? s->total : *a + s->chunk;
    return 1;
}

static inline void pagedcy_team_init(pagedcy_team *tm, int nt) {
    atomic_init(&tm->gen, 0u);
    atomic_init(&tm->done, 0);
    atomic_init(&tm->stop, 0);
    tm->fn = 0;
    tm->arg = 0;
    tm->nt = nt;
}

static inline void pagedcy_team_relax(unsigned *spins) {
    if (++*spins < PAGEDCY_TEAM_SPINS) PAGEDCY_TEAM_PAUSE();
    else sched_yield();
}

/* Thread t (> 0): run every job posted until the step ends. */
static inline void pagedcy_team_helper(pagedcy_team *tm, int t) {
    unsigned seen = 0;
    for (;;) {
        unsigned g, spins = 0;
        while ((g = atomic_load_explicit(&tm->gen, memory_order_acquire)) == seen) pagedcy_team_relax(&spins);
        seen = g;
        if (atomic_load_explicit(&tm->stop, memory_order_acquire)) return;
        tm->fn(tm->arg, t, tm->nt);
        atomic_fetch_add_explicit(&tm->done, 1, memory_order_acq_rel);
    }
}

/* Thread 0: fn(arg, t, nt) on every thread of the team; returns when all are done. */
static inline void pagedcy_team_run(pagedcy_team *tm, pagedcy_team_fn fn, void *arg) {
    unsigned spins = 0;
    tm->fn = fn;
    tm->arg = arg;
    atomic_store_explicit(&tm->done, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&tm->gen, 1u, memory_order_release);
    fn(arg, 0, tm->nt);
    while (atomic_load_explicit(&tm->done, memory_order_acquire) < tm->nt - 1) pagedcy_team_relax(&spins);
}

/* Thread 0: end the step (the helpers return from pagedcy_team_helper). */
static inline void pagedcy_team_stop(pagedcy_team *tm) {
    atomic_store_explicit(&tm->stop, 1, memory_order_release);
    atomic_fetch_add_explicit(&tm->gen, 1u, memory_order_release);
}

#endif
