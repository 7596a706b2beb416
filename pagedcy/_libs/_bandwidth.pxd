from libc.stdint cimport int64_t

# One timed pass of read_bandwidth: the sum of x[0:n] read by num_threads OpenMP threads.
cdef double c_read_pass(const float *x, int64_t n, int num_threads) noexcept nogil
