"""OpenMP availability and the thread-count policy shared by every kernel."""
import os

from pagedcy._libs._openmp cimport (omp_get_max_threads, PAGEDCY_OPENMP, PAGEDCY_BUILD_FLAGS,
                                    pagedcy_openmp_runtime, pagedcy_openmp_display_env)
from pagedcy import _validate


def openmp_enabled():
    """Return True when the extension was built with OpenMP (kernels run in parallel)."""
    return bool(PAGEDCY_OPENMP)


def build_flags():
    """Return the extra compiler/linker flags this build used, as one string."""
    return (<bytes>PAGEDCY_BUILD_FLAGS).decode()


def openmp_runtime():
    """The path of the OpenMP runtime pagedcy's kernels run on ("" in a serial build or where
    that cannot be told). On Linux builds with GCC it is pagedcy's own copy,
    ``libpagedcy_gomp.so.1``, which no other library shares."""
    return (<bytes>pagedcy_openmp_runtime()).decode(errors="replace")


def _display_openmp_env():
    """Private: the runtime prints its settings (``omp_display_env(1)``) to the C stderr."""
    pagedcy_openmp_display_env()


def max_threads():
    """The OpenMP default thread count (1 in a serial build)."""
    return omp_get_max_threads()


def resolve_num_threads(num_threads=None):
    """Thread count a kernel should use.

    ``num_threads`` (a positive int) wins; else ``PAGEDCY_NUM_THREADS`` from the
    environment; else the OpenMP default. Always 1 in a serial build; at most 1024.
    Raises TypeError for a non-integer request, ValueError for a non-positive one
    or a bad environment value.
    """
    if type(num_threads) is int and 0 < <object>num_threads <= 1024:   # every kernel call
        return num_threads if PAGEDCY_OPENMP else 1
    if num_threads is None:
        env = os.environ.get("PAGEDCY_NUM_THREADS", "").strip()
        if not env:
            return omp_get_max_threads() if PAGEDCY_OPENMP else 1
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"PAGEDCY_NUM_THREADS must be a positive integer, got {env!r}")
    else:
        n = _validate.check_positive(num_threads, "num_threads")
    return min(n, 1024) if PAGEDCY_OPENMP else 1


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
