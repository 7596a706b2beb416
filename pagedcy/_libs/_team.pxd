# The step-scoped thread team (pagedcy_team.h): kernels called inside run_in_team post their
# static split to it instead of opening an OpenMP region of their own.
cdef extern from "pagedcy_team.h" nogil:
    ctypedef void (*pagedcy_team_fn)(void *arg, int t, int nt) noexcept nogil

cdef int team_threads() noexcept nogil
cdef int team_run(pagedcy_team_fn fn, void *arg) noexcept nogil
