"""Memory read-bandwidth yardsticks for the kernels' "% of bandwidth" figures.

``read_bandwidth``: long sequential streams, the best case of the memory
system. ``page_read_bandwidth``: the same buffer read the way decode reads a
paged KV cache (random pages, a few at a time, row by row) with no compute,
the best a kernel walking such pages can hope for. ``fma_rate``: the core's
float32 FMA throughput at an instruction-set level, the arithmetic ceiling."""
import time

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t, int32_t

from pagedcy._libs._threads import resolve_num_threads
from pagedcy import _validate

cnp.import_array()

cdef extern from *:
    """
    #include "pagedcy_convert.h"
    /* Sum of n floats with 4 independent accumulators, so the loop is limited
     * by loads rather than by the add latency. */
    static float pagedcy_bw_sum_scalar(const float *x, long long n) {
        float a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        long long i = 0;
        for (; i + 4 <= n; i += 4) { a0 += x[i]; a1 += x[i + 1]; a2 += x[i + 2]; a3 += x[i + 3]; }
        for (; i < n; i++) a0 += x[i];
        return a0 + a1 + a2 + a3;
    }
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    /* Four streams at once (the quarters of the range, read in lockstep):
     * like the attention kernel's K and V page walks, several concurrent
     * streams keep more prefetch streams and DRAM banks busy than one does
     * (one core: 21 GB/s against 15.6 for a single stream, measured on the
     * development VM with a 2 GiB buffer). */
    __attribute__((target("avx2,fma")))
    static float pagedcy_bw_sum_avx2(const float *x, long long n) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const long long q = (n / 4) & ~15LL;
        const float *x0 = x, *x1 = x + q, *x2 = x + 2 * q, *x3 = x + 3 * q;
        for (long long i = 0; i < q; i += 16) {
            a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_loadu_ps(x0 + i), _mm256_loadu_ps(x0 + i + 8)));
            a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_loadu_ps(x1 + i), _mm256_loadu_ps(x1 + i + 8)));
            a2 = _mm256_add_ps(a2, _mm256_add_ps(_mm256_loadu_ps(x2 + i), _mm256_loadu_ps(x2 + i + 8)));
            a3 = _mm256_add_ps(a3, _mm256_add_ps(_mm256_loadu_ps(x3 + i), _mm256_loadu_ps(x3 + i + 8)));
        }
        __m256 a = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
        float t[8];
        _mm256_storeu_ps(t, a);
        float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
        for (long long i = 4 * q; i < n; i++) s += x[i];
        return s;
    }
    #endif
    static float pagedcy_bw_sum(const float *x, long long n) {
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
        if (pagedcy_use_simd()) return pagedcy_bw_sum_avx2(x, n);
    #endif
        return pagedcy_bw_sum_scalar(x, n);
    }
    """
    float pagedcy_bw_sum(const float *x, long long n) noexcept nogil

cdef extern from *:
    """
    /* Sum of one row of n floats (n a multiple of 16), 16 at a time. */
    static inline void pagedcy_bw_row_scalar(const float *x, long long n, float *acc) {
        for (long long i = 0; i < n; i += 16)
            for (int k = 0; k < 16; k++) acc[k] += x[i + k];
    }
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    __attribute__((target("avx2,fma")))
    static double pagedcy_bw_walk_avx2(const char *base, const int32_t *order, long long n, long long page_bytes,
                                      int streams, long long row_bytes) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;
        const long long rf = row_bytes / 4, nrows = page_bytes / row_bytes;
        for (long long g = 0; g < n; g += streams) {
            const int w = n - g < streams ? (int)(n - g) : streams;
            for (long long r = 0; r < nrows; r++)
                for (int j = 0; j < w; j++) {
                    const float *x = (const float *)(base + (long long)order[g + j] * page_bytes) + r * rf;
                    for (long long i = 0; i < rf; i += 16) {
                        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + i));
                        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + i + 8));
                    }
                }
        }
        float t[8];
        _mm256_storeu_ps(t, _mm256_add_ps(a0, a1));
        double s = 0;
        for (int k = 0; k < 8; k++) s += t[k];
        return s;
    }
    #endif
    /* Pages order[0:n) (page_bytes each, of base) taken `streams` at a time;
     * within a group, row r of every page in turn, rows front to back: the
     * order of a multi-page decode step. */
    static double pagedcy_bw_walk(const char *base, const int32_t *order, long long n, long long page_bytes,
                                 int streams, long long row_bytes) {
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
        if (pagedcy_use_simd()) return pagedcy_bw_walk_avx2(base, order, n, page_bytes, streams, row_bytes);
    #endif
        float acc[16] = {0};
        const long long nrows = page_bytes / row_bytes;
        for (long long g = 0; g < n; g += streams) {
            const int w = n - g < streams ? (int)(n - g) : streams;
            for (long long r = 0; r < nrows; r++)
                for (int j = 0; j < w; j++)
                    pagedcy_bw_row_scalar((const float *)(base + (long long)order[g + j] * page_bytes + r * row_bytes),
                                          row_bytes / 4, acc);
        }
        double s = 0;
        for (int k = 0; k < 16; k++) s += acc[k];
        return s;
    }
    """
    double pagedcy_bw_walk(const char *base, const int32_t *order, long long n, long long page_bytes,
                          int streams, long long row_bytes) noexcept nogil


cdef extern from *:
    """
    /* n rounds of C independent FMA chains x = x*m + c (m, c run-time values
     * the compiler cannot fold: the caller passes 1 and 0, so every lane keeps
     * its start value and the returned sum checks the work). C chains hide the
     * 4-cycle FMA latency on two FMA ports (8 would be the minimum). */
    #define PAGEDCY_FMA_CHAINS 12
    static double pagedcy_fma_scalar(long long n, float m, float c) {
        float x[PAGEDCY_FMA_CHAINS];
        for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) x[i] = (float)(i + 1);
        for (long long r = 0; r < n; r++)
            for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) x[i] = x[i] * m + c;  /* FMA where the build has it */
        double s = 0;
        for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) s += x[i];
        return s;
    }
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
    #define PAGEDCY_FMA_BODY(w, vec, lanes) do {                                        \
            vec x[PAGEDCY_FMA_CHAINS];                                                 \
            const vec vm = w##_set1_ps(m), vc = w##_set1_ps(c);                        \
            for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) x[i] = w##_set1_ps((float)(i + 1)); \
            for (long long r = 0; r < n; r++)                                          \
                for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) x[i] = w##_fmadd_ps(x[i], vm, vc); \
            double s = 0;                                                              \
            for (int i = 0; i < PAGEDCY_FMA_CHAINS; i++) {                             \
                float t[lanes];                                                        \
                w##_storeu_ps(t, x[i]);                                                \
                for (int k = 0; k < lanes; k++) s += t[k];                             \
            }                                                                          \
            return s / lanes;                                                          \
        } while (0)
    __attribute__((target("avx2,fma")))
    static double pagedcy_fma_avx2(long long n, float m, float c) { PAGEDCY_FMA_BODY(_mm256, __m256, 8); }
    __attribute__((target("avx512f,avx2,fma")))
    static double pagedcy_fma_avx512(long long n, float m, float c) { PAGEDCY_FMA_BODY(_mm512, __m512, 16); }
    #endif
    /* Lanes per FMA instruction at `level` (capped by the CPU's); 0: none. */
    static int pagedcy_fma_lanes(int level) {
        if (level > pagedcy_simd_level()) level = pagedcy_simd_level();
        return level >= PAGEDCY_SIMD_AVX512 ? 16 : level == PAGEDCY_SIMD_AVX2 ? 8 : 1;
    }
    /* The chains' sum divided by the lanes (the scalar chains' sum: 78 when
     * nothing was dropped), so every level returns the same checksum. */
    static double pagedcy_fma_run(int level, long long n, float m, float c) {
        const int lanes = pagedcy_fma_lanes(level);
    #if PAGEDCY_X86 && (defined(__GNUC__) || defined(__clang__))
        if (lanes == 16) return pagedcy_fma_avx512(n, m, c);
        if (lanes == 8) return pagedcy_fma_avx2(n, m, c);
    #endif
        (void)lanes;
        return pagedcy_fma_scalar(n, m, c);
    }
    """
    int PAGEDCY_FMA_CHAINS
    int pagedcy_fma_lanes(int level) noexcept nogil
    double pagedcy_fma_run(int level, long long n, float m, float c) noexcept nogil


cdef double c_fma_pass(int level, int64_t rounds, int num_threads, float m, float c) noexcept nogil:
    """Sum of every thread's chain checksum (each runs ``rounds`` rounds)."""
    cdef int i
    cdef double total = 0.0
    for i in prange(num_threads, num_threads=num_threads, schedule='static', chunksize=1):
        total += pagedcy_fma_run(level, rounds, m, c)
    return total


def fma_rate(num_threads=None, simd=2, repeats=5, *, rounds=2_000_000):
    """Best float32 FMA throughput in lane-FMAs per second over ``repeats`` passes.

    Each of ``num_threads`` threads (``resolve_num_threads``) runs ``rounds``
    rounds of 12 independent FMA chains at instruction-set level ``simd``
    (0 scalar, 1 AVX2: 8 lanes, 2 AVX-512: 16 lanes; capped by the CPU's and
    ``PAGEDCY_SIMD``), so one lane-FMA is one multiply-add of one float: the
    arithmetic ceiling of a kernel whose inner loop is FMAs. An untimed pass
    comes first. Raises TypeError for non-integers, ValueError for ``simd``
    outside [0, 2] or ``repeats`` / ``rounds`` outside [1, 2**31).
    """
    reps = _validate.check_positive(repeats, "repeats", 2**31)
    cdef int64_t n = _validate.check_positive(rounds, "rounds", 2**31)
    lvl = _validate.check_count(simd, "simd")
    if lvl > 2:
        raise ValueError(f"simd must be 0, 1 or 2, got {lvl}")
    cdef int level = lvl
    cdef int nt = resolve_num_threads(num_threads)
    cdef int lanes = pagedcy_fma_lanes(level)
    cdef double total
    # 1 + 2 + ... + chains per thread, what 12 chains starting at 1..12 keep under x*1 + 0
    cdef double want = nt * PAGEDCY_FMA_CHAINS * (PAGEDCY_FMA_CHAINS + 1) / 2.0
    best = 0.0
    for it in range(reps + 1):
        t0 = time.perf_counter()
        with nogil:
            total = c_fma_pass(level, n, nt, 1.0, 0.0)
        dt = time.perf_counter() - t0
        if total != want:
            raise RuntimeError(f"fma_rate: checksum {total} != {want}")
        if it > 0:
            best = max(best, <double>n * PAGEDCY_FMA_CHAINS * lanes * nt / dt)
    return best


cdef double c_pass(const char *base, const int32_t *order, int64_t n, int64_t granule, int64_t page_bytes,
                   int streams, int64_t row_bytes, int num_threads) noexcept nogil:
    """Sum of one pass, split by num_threads threads into 16 contiguous runs each
    (whole multiples of `granule` items): the n floats at base when order is NULL
    (read_bandwidth), else the page walk over order[0:n) (page_read_bandwidth)."""
    cdef int64_t nchunks = num_threads * 16
    cdef int64_t per = ((n + granule - 1) // granule + nchunks - 1) // nchunks * granule
    cdef int64_t c, lo, hi
    cdef double total = 0.0
    for c in prange(nchunks, num_threads=num_threads, schedule='static'):
        lo = c * per
        hi = lo + per
        if hi > n:
            hi = n
        if lo < hi:
            if order == NULL:
                total += pagedcy_bw_sum(<const float *>base + lo, hi - lo)
            else:
                total += pagedcy_bw_walk(base, order + lo, hi - lo, page_bytes, streams, row_bytes)
    return total


def _ones_buffer(nbytes, buffer):
    """The float32 buffer of ones a yardstick reads: ``buffer`` checked, or ``nbytes`` new."""
    if buffer is not None:
        return _check_f32_buffer(buffer)
    size = _validate.check_count(nbytes, "nbytes")
    if size < 4096:
        raise ValueError(f"nbytes must be >= 4096, got {size}")
    return np.ones(size // 4, dtype=np.float32)     # touching it faults the pages in


def _best_rate(name, buf, int reps, num_threads, order=None, int64_t page_bytes=0, int streams=1,
               int64_t row_bytes=0):
    """Best GB/s over ``reps`` (validated) timed passes after an untimed one; every
    pass's sum must equal the number of floats read (a buffer of ones), which also
    keeps the compiler from dropping the loads."""
    cdef int nt = resolve_num_threads(num_threads)
    cdef const char *base = <const char *>cnp.PyArray_DATA(buf)
    cdef const int32_t[::1] o = order
    cdef const int32_t *op = &o[0] if order is not None else NULL
    cdef int64_t n = o.shape[0] if order is not None else buf.shape[0]
    cdef int64_t granule = streams if order is not None else 1
    cdef double total
    nread = n * page_bytes if order is not None else buf.nbytes
    best = 0.0
    for it in range(reps + 1):
        t0 = time.perf_counter()
        with nogil:
            total = c_pass(base, op, n, granule, page_bytes, streams, row_bytes, nt)
        dt = time.perf_counter() - t0
        if total != <double>(nread // 4):
            raise ValueError(f"{name}: the sum of a pass is not the number of floats read: "
                             "the buffer must hold ones")
        if it > 0:
            best = max(best, nread / dt / 1e9)
    return best


def read_bandwidth(nbytes=512 * 2**20, num_threads=None, repeats=5, *, buffer=None):
    """Best read bandwidth in GB/s (1e9 bytes/s) over ``repeats`` passes.

    Each pass sums a float32 buffer of ``nbytes`` bytes (filled with ones)
    with a ``nogil`` ``prange`` over contiguous per-thread chunks, each read
    as four concurrent streams (AVX2 when available). An untimed first pass
    comes before the timed ones, so a freshly written buffer is not partly
    read back from the last-level cache. ``buffer``: a 1-D C-contiguous
    float32 array of ones to reuse instead (``nbytes`` is then its size), so
    repeated calls do not allocate. ``num_threads`` follows
    ``resolve_num_threads``. Raises TypeError for non-integer sizes or a
    non-float32 buffer, ValueError for ``nbytes < 4096``, ``repeats`` outside
    ``[1, 2**31)``, a buffer of the wrong shape, or one that does not hold ones
    (found after the untimed pass).
    """
    reps = _validate.check_positive(repeats, "repeats", 2**31)
    return _best_rate("read_bandwidth", _ones_buffer(nbytes, buffer), reps, num_threads)


def _walk_setup(buf, page_bytes, streams, row_bytes, seed):
    """Validated (page size, streams, row size) of a page walk over ``buf`` and its
    random page order (int32, one entry per whole page)."""
    pb = _validate.check_positive(page_bytes, "page_bytes")
    st = _validate.check_positive(streams, "streams", 65)
    rb = _validate.check_positive(row_bytes, "row_bytes")
    if rb % 64:
        raise ValueError(f"row_bytes must be a multiple of 64, got {rb}")
    if pb % rb:
        raise ValueError(f"page_bytes ({pb}) must be a multiple of row_bytes ({rb})")
    npages = buf.nbytes // pb
    if npages < 1:
        raise ValueError(f"the buffer ({buf.nbytes} bytes) holds no whole page of {pb} bytes")
    if npages > 2**31 - 1:
        raise ValueError(f"too many pages ({npages}); use larger pages")
    order = np.random.default_rng(seed).permutation(npages).astype(np.int32)
    return pb, st, rb, order


def _check_f32_buffer(buffer, min_bytes=4096):
    """``buffer`` if it is a 1-D C-contiguous float32 array of at least ``min_bytes``."""
    if not isinstance(buffer, np.ndarray) or buffer.dtype != np.float32:
        raise TypeError("buffer must be a float32 numpy array")
    if buffer.ndim != 1 or not buffer.flags.c_contiguous or buffer.nbytes < min_bytes:
        raise ValueError(f"buffer must be 1-D, C-contiguous and at least {min_bytes} bytes")
    return buffer


def _page_walk_sum(buffer, page_bytes, streams=4, row_bytes=512, seed=0):
    """Sum (float) of the whole pages of a 1-D float32 ``buffer`` read in
    ``page_read_bandwidth``'s order, on one thread; for tests."""
    buf = _check_f32_buffer(buffer, 4)
    pb, st, rb, order = _walk_setup(buf, page_bytes, streams, row_bytes, seed)
    cdef const int32_t[::1] o = order
    cdef const char *base = <const char *>cnp.PyArray_DATA(buf)
    cdef int64_t pb_c = pb, rb_c = rb
    cdef int st_c = st
    with nogil:
        total = c_pass(base, &o[0], o.shape[0], st_c, pb_c, st_c, rb_c, 1)
    return total


def page_read_bandwidth(page_bytes=128 * 1024, nbytes=512 * 2**20, num_threads=None, repeats=5, *,
                        streams=4, row_bytes=512, seed=0, buffer=None):
    """Best read rate in GB/s of a paged-KV-style walk over ``repeats`` passes.

    The buffer (``nbytes``, or ``buffer``: a 1-D float32 array of ones) is cut
    into whole pages of ``page_bytes``, visited in a random order (``seed``),
    ``streams`` pages at a time: row ``r`` (``row_bytes``) of each page of the
    group in turn, rows front to back, summed with no other work. That is the
    order of a multi-page decode step over head-major pages (128 KiB: one
    layer of a 16-token page with 8 KV heads of 128 float32), so the rate is
    what one such walk can draw from memory with the hardware prefetchers
    alone: the ceiling the kernel's "% of bw" is up against on CPUs whose
    prefetchers lose ground at every page. Threads take contiguous runs of the
    order; an untimed pass comes first. Raises TypeError / ValueError as
    ``read_bandwidth`` does, and ValueError for a ``row_bytes`` that is not a
    multiple of 64 or does not divide ``page_bytes``, ``streams`` outside
    [1, 64], or no whole page in the buffer.
    """
    reps = _validate.check_positive(repeats, "repeats", 2**31)
    buf = _ones_buffer(nbytes, buffer)
    pb, st, rb, order = _walk_setup(buf, page_bytes, streams, row_bytes, seed)
    return _best_rate("page_read_bandwidth", buf, reps, num_threads, order, pb, st, rb)
