"""OpenMP availability and the thread-count policy shared by every kernel."""
import os

from pagedcy._libs._openmp cimport omp_get_max_threads, PAGEDCY_OPENMP, PAGEDCY_BUILD_FLAGS


def openmp_enabled():
    """Return True when the extension was built with OpenMP (kernels run in parallel)."""
    return bool(PAGEDCY_OPENMP)


def build_flags():
    """Return the extra compiler/linker flags this build used, as one string."""
    return (<bytes>PAGEDCY_BUILD_FLAGS).decode()


def max_threads():
    """The OpenMP default thread count (1 in a serial build)."""
    return omp_get_max_threads()


cpdef int resolve_num_threads(object num_threads=None) except -1:
    """Thread count a kernel should use.

    ``num_threads`` (a positive int) wins; else ``PAGEDCY_NUM_THREADS`` from the
    environment; else the OpenMP default. Always 1 in a serial build.
    Raises ValueError for a non-positive or non-integer request.
    """
    if num_threads is None:
        env = os.environ.get("PAGEDCY_NUM_THREADS", "").strip()
        if env:
            try:
                num_threads = int(env)
            except ValueError:
                raise ValueError(f"PAGEDCY_NUM_THREADS must be a positive integer, got {env!r}")
        else:
            return omp_get_max_threads() if PAGEDCY_OPENMP else 1
    if isinstance(num_threads, bool):
        raise TypeError("num_threads must be an int, got bool")
    if not isinstance(num_threads, int):
        try:
            import operator
            num_threads = operator.index(num_threads)
        except TypeError:
            raise TypeError(f"num_threads must be an int, got {type(num_threads).__name__}")
    if num_threads < 1:
        raise ValueError(f"num_threads must be >= 1, got {num_threads}")
    if not PAGEDCY_OPENMP:
        return 1
    return min(num_threads, 1024)


cdef extern from "pagedcy_convert.h" nogil:
    int pagedcy_simd_level()
    int pagedcy_cpu_has_avx2_fma()
    int pagedcy_cpu_has_avx512()


def simd_path():
    """The run-time-dispatched kernel instruction set, as text:
    'avx512+avx2+fma+f16c' (AVX-512 decode kernels), 'avx2+fma+f16c' or
    'scalar', with the reason when PAGEDCY_SIMD / PAGEDCY_FORCE_SCALAR capped it."""
    level = pagedcy_simd_level()
    best = 2 if pagedcy_cpu_has_avx512() else 1 if pagedcy_cpu_has_avx2_fma() else 0
    name = ("scalar", "avx2+fma+f16c", "avx512+avx2+fma+f16c")[level]
    if level < best:
        name += " (capped by PAGEDCY_SIMD / PAGEDCY_FORCE_SCALAR)"
    return name
