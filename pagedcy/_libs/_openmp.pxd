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
    #if PAGEDCY_OPENMP && defined(__linux__) && defined(__GLIBC__)
    #include <dlfcn.h>
    /* GCC emits calls to GOMP_parallel for every parallel region (prange). */
    extern void GOMP_parallel(void (*)(void *), void *, unsigned, unsigned);
    /* The file of the OpenMP runtime the parallel regions bind to ("" if unknown): a
     * runtime loaded earlier into the global scope (torch's) would serve them. */
    static const char *pagedcy_openmp_runtime(void) {
        Dl_info info;
        if (dladdr((void *)&GOMP_parallel, &info) && info.dli_fname) return info.dli_fname;
        return "";
    }
    #else
    static const char *pagedcy_openmp_runtime(void) { return ""; }
    #endif
    #if PAGEDCY_OPENMP && defined(__GNUC__) && !defined(__clang__)
    static void pagedcy_openmp_display_env(void) { omp_display_env(1); }
    #else
    static void pagedcy_openmp_display_env(void) { }
    #endif
    """
    int omp_get_max_threads() noexcept nogil
    int omp_get_thread_num() noexcept nogil
    int omp_get_num_threads() noexcept nogil
    int PAGEDCY_OPENMP
    const char *PAGEDCY_BUILD_FLAGS
    const char *pagedcy_openmp_runtime() noexcept nogil
    void pagedcy_openmp_display_env() noexcept nogil
