from libc.stdint cimport int64_t, int32_t

# One timed pass of read_bandwidth (order NULL: the sum of n floats at base) or of
# page_read_bandwidth (the page walk over order[0:n)), read by num_threads OpenMP threads.
cdef double c_pass(const char *base, const int32_t *order, int64_t n, int64_t granule, int64_t page_bytes,
                   int streams, int64_t row_bytes, int num_threads) noexcept nogil
