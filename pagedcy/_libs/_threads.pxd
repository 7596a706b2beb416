# _threads has no C-level API of its own: resolve_num_threads is a Python function (every
# caller is at the Python boundary, before its nogil section). These are the CPU-feature
# probes it reports through simd_path().
cdef extern from "pagedcy_convert.h" nogil:
    int pagedcy_simd_level()
    int pagedcy_cpu_has_avx2_fma()
    int pagedcy_cpu_has_avx512()
