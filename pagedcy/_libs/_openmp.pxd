# The one place that talks to OpenMP. Every .pyx cimports from here, so each
# module builds with or without OpenMP (PAGEDCY_OPENMP is set by setup.py).
cdef extern from *:
    """
    #if PAGEDCY_OPENMP
    #include <omp.h>
    #else
    static inline int omp_get_max_threads(void) { return 1; }
    static inline int omp_get_thread_num(void) { return 0; }
    static inline int omp_get_num_threads(void) { return 1; }
    #endif
    #ifndef PAGEDCY_BUILD_FLAGS
    #define PAGEDCY_BUILD_FLAGS ""
    #endif
    """
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    int omp_get_num_threads() noexcept nogil
    int PAGEDCY_OPENMP
    const char *PAGEDCY_BUILD_FLAGS
