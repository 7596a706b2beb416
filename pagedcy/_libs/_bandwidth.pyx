"""Memory read-bandwidth yardstick for the kernels' "% of bandwidth" figures."""
import time

import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange
from libc.stdint cimport int64_t

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


cdef double c_read_pass(const float *x, int64_t n, int num_threads) noexcept nogil:
    """Sum of x[0:n], read by num_threads threads in contiguous chunks (16 per thread)."""
    cdef int64_t nchunks = num_threads * 16
    cdef int64_t per = (n + nchunks - 1) // nchunks
    cdef int64_t c, lo, hi
    cdef double total = 0.0
    for c in prange(nchunks, num_threads=num_threads, schedule='static'):
        lo = c * per
        hi = lo + per
        if hi > n:
            hi = n
        if lo < hi:
            total += pagedcy_bw_sum(x + lo, hi - lo)
    return total


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
    non-float32 buffer, ValueError for ``nbytes < 4096``, ``repeats < 1`` or
    a buffer of the wrong shape.
    """
    reps = _validate.check_positive(repeats, "repeats")
    if buffer is None:
        size = _validate.check_count(nbytes, "nbytes")
        if size < 4096:
            raise ValueError(f"nbytes must be >= 4096, got {size}")
        buf = np.ones(size // 4, dtype=np.float32)     # touching it faults the pages in
    else:
        buf = buffer
        if not isinstance(buf, np.ndarray) or buf.dtype != np.float32:
            raise TypeError("buffer must be a float32 numpy array")
        if buf.ndim != 1 or not buf.flags.c_contiguous or buf.nbytes < 4096:
            raise ValueError("buffer must be 1-D, C-contiguous and at least 4096 bytes")
    size = buf.nbytes
    cdef int nt = resolve_num_threads(num_threads)
    cdef const float *x = <const float *>cnp.PyArray_DATA(buf)
    cdef int64_t n = buf.shape[0]
    cdef double total
    best = 0.0
    for it in range(reps + 1):
        t0 = time.perf_counter()
        with nogil:
            total = c_read_pass(x, n, nt)
        dt = time.perf_counter() - t0
        if total != <double>n:       # uses the result, and checks the loop read everything
            raise RuntimeError("read_bandwidth: checksum mismatch (is the buffer all ones?)")
        if it > 0:
            best = max(best, size / dt / 1e9)
    return best
