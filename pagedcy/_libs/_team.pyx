"""A team of threads held awake through one decode step (``pagedcy_team.h`` says why).

``run_in_team(fn, num_threads)`` calls ``fn()`` on this thread inside one OpenMP region of
``num_threads`` threads; the others spin until a kernel that ``fn`` calls posts its work
(``team_run``, cimported by the kernels) or ``fn`` returns. Kernels called from another
thread, or outside ``run_in_team``, open their own regions as before. Same bits either way:
a kernel posts the static split its own region would use.
"""
from cython.parallel cimport parallel, prange

from pagedcy._libs._openmp cimport omp_get_num_threads, omp_get_thread_num, PAGEDCY_OPENMP
from pagedcy._libs._threads import resolve_num_threads

cdef extern from "pagedcy_team.h" nogil:
    ctypedef struct pagedcy_team:
        int nt
    void pagedcy_team_init(pagedcy_team *tm, int nt)
    void pagedcy_team_helper(pagedcy_team *tm, int t)
    void pagedcy_team_run(pagedcy_team *tm, pagedcy_team_fn fn, void *arg)
    void pagedcy_team_stop(pagedcy_team *tm)

cdef extern from *:
    """
    /* the team of this thread's current step (thread 0's), NULL outside run_in_team */
    static __thread pagedcy_team *pagedcy_team_cur = 0;
    /* jobs posted to any team, for tests and diagnosis */
    static long long pagedcy_team_jobs = 0;
    static inline void pagedcy_team_count(void) { __atomic_fetch_add(&pagedcy_team_jobs, 1, __ATOMIC_RELAXED); }
    """
    pagedcy_team *pagedcy_team_cur
    long long pagedcy_team_jobs
    void pagedcy_team_count() noexcept nogil


cdef int team_threads() noexcept nogil:
    """Threads of the calling thread's team, 0 outside ``run_in_team``."""
    return pagedcy_team_cur.nt if pagedcy_team_cur != NULL else 0


cdef int team_run(pagedcy_team_fn fn, void *arg) noexcept nogil:
    """``fn(arg, t, nt)`` for every thread t of the calling thread's team, returning when all
    are done: 0, or -1 (nothing run) outside ``run_in_team``."""
    if pagedcy_team_cur == NULL:
        return -1
    pagedcy_team_count()
    pagedcy_team_run(pagedcy_team_cur, fn, arg)
    return 0


cdef void run_split(pagedcy_team_fn fn, void *arg, int nt) noexcept nogil:
    """``fn(arg, t, nt)`` for t in [0, nt): on the calling thread's team when it has nt
    threads, else in an OpenMP region of its own (or inline for nt <= 1). Every kernel's
    parallel split goes through here, so both ways run the same job code."""
    cdef int t
    if nt <= 1:
        fn(arg, 0, 1)
    elif team_threads() == nt:
        team_run(fn, arg)
    else:
        for t in prange(nt, num_threads=nt, schedule="static"):
            fn(arg, t, nt)


# A panel GEMV's weight (_q8panel, decode sizes) from _dyn_min_bytes up is split dynamically
# (split_of): _dyn_chunks chunks of rows per thread, claimed in turn (pagedcy_split_next), not
# one contiguous share each. Why: on a shared VM one vCPU often runs slower for a while (steal
# time, a neighbour's memory traffic), and with fixed shares the other then waits at the join;
# claimed chunks also keep the threads' two streams next to each other in memory, as
# llama.cpp's chunked mat-mul does. Same bits either way (an output column does not depend on
# the thread). Panel weights (GGUF files), decode tok/s, one process alternating the splits
# every round, median of the per-round ratios to fixed shares, 2 threads, AMD EPYC Zen 4
# (family 25 model 17), 2026-12-03 (asv_benches/decode_split.py):
#   8 chunks from 1 MiB: llama-3.2-1b Q4_K_M 1.14, 1.08, 1.10, 1.08; gemma3-270m Q4_K_M 1.05, 0.99;
#   qwen2.5-0.5b Q4_K_M 1.06; gemma3-270m Q8_0 1.03.
#   4 chunks from 4 MiB: llama 1.13, 0.98, 1.05, 1.03, 1.04; gemma Q4_K_M 1.09, 1.00, 0.98.
#   4 chunks at every size: llama 1.09, 1.05; gemma 1.07, 1.02.
#   One chunk a thread (the fixed shares again): 0.999.
# Prefill-sized calls (the packed paths) keep fixed shares: not measured there. The dense
# GEMV (_gemm: float32 / 16-bit weights) keeps them too: it lost by it, bf16 qwen2.5-0.5b
# shape 0.83 (8 chunks from 1 MiB), 0.89 (4 at every size), 0.89 (4 from 4 MiB), likely its
# software prefetch (PG_PF_BYTES ahead) running past each chunk's end and starting cold.
cdef long long _dyn_min_bytes = 1 << 20
cdef int _dyn_chunks = 8


def _set_dynamic(min_bytes, chunks=8):
    """Private (tests, A/B runs): split weights of at least ``min_bytes`` bytes into ``chunks``
    claimed chunks per thread (a huge ``min_bytes``: fixed shares always). Returns the previous
    ``(min_bytes, chunks)``."""
    global _dyn_min_bytes, _dyn_chunks
    if int(chunks) < 1 or int(min_bytes) < 0:
        raise ValueError("min_bytes must be >= 0 and chunks >= 1")
    prev = (_dyn_min_bytes, _dyn_chunks)
    _dyn_min_bytes, _dyn_chunks = min(int(min_bytes), 1 << 62), min(int(chunks), 1 << 16)
    return prev


cdef pagedcy_split split_of(int total, int nt, double weight_bytes, bint decode) noexcept nogil:
    """How nt threads share ``total`` units of a GEMM over ``weight_bytes`` of weight: fixed
    shares (chunk 0), or for a decode-sized call (``decode``: the panels' decode kernels, not
    the packed tile) from ``_dyn_min_bytes`` up ``_dyn_chunks`` chunks a thread."""
    cdef pagedcy_split s
    s.total, s.chunk, s.next = total, 0, 0
    if decode and nt > 1 and weight_bytes >= _dyn_min_bytes:
        s.chunk = max(1, total // (_dyn_chunks * nt))
    return s


def jobs_posted():
    """How many kernel calls have posted their work to a team in this process."""
    return pagedcy_team_jobs


cdef int _call(list box, pagedcy_team *tm) noexcept with gil:
    """box = [fn, result, exception]: fn() with tm as this thread's team."""
    global pagedcy_team_cur
    pagedcy_team_cur = tm
    try:
        box[1] = box[0]()
    except BaseException as e:      # re-raised by run_in_team once the region has ended
        box[2] = e
    finally:
        pagedcy_team_cur = NULL
    return 0


def in_team():
    """True while this thread runs inside ``run_in_team``."""
    return pagedcy_team_cur != NULL


def run_in_team(fn, num_threads=None):
    """``fn()``, with ``num_threads`` threads (``resolve_num_threads``) held awake for the
    kernels it calls: one OpenMP region for the whole call instead of one per kernel call.
    Returns what ``fn`` returns and raises what it raises. Runs ``fn()`` plainly with one
    thread, in a serial build, or when already inside a team."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    cdef int nt = resolve_num_threads(num_threads)
    if nt <= 1 or not PAGEDCY_OPENMP or pagedcy_team_cur != NULL:
        return fn()
    cdef pagedcy_team tm
    cdef list box = [fn, None, None]
    pagedcy_team_init(&tm, nt)
    with nogil, parallel(num_threads=nt):
        if omp_get_thread_num() == 0:
            tm.nt = omp_get_num_threads()
            _call(box, &tm)
            pagedcy_team_stop(&tm)
        else:
            pagedcy_team_helper(&tm, omp_get_thread_num())
    if box[2] is not None:
        raise box[2]
    return box[1]
