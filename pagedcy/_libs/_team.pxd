# The step-scoped thread team (pagedcy_team.h): kernels called inside run_in_team post their
# split to it instead of opening an OpenMP region of their own (run_split does either).
cdef extern from "pagedcy_team.h" nogil:
    ctypedef void (*pagedcy_team_fn)(void *arg, int t, int nt) noexcept nogil
    long long pagedcy_claim(long long *next)
    void pagedcy_atomic_or(int *p, int v)
    ctypedef struct pagedcy_split:
        int total, chunk
        long long next
    int pagedcy_split_next(pagedcy_split *s, int t, int nt, int *state, int *a, int *b)

cdef int team_threads() noexcept nogil
cdef int team_run(pagedcy_team_fn fn, void *arg) noexcept nogil
cdef void run_split(pagedcy_team_fn fn, void *arg, int nt) noexcept nogil
cdef pagedcy_split split_of(int total, int nt, double weight_bytes, bint decode) noexcept nogil
