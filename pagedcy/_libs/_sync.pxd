# A per-object mutex for extension types whose methods release the GIL.
# Metadata changes happen under the lock; the GIL is dropped only while
# blocking on it, so a thread inside a nogil copy never deadlocks against a
# thread waiting for the lock.
from cpython.pythread cimport (
    PyThread_type_lock, PyThread_allocate_lock, PyThread_free_lock,
    PyThread_acquire_lock, PyThread_release_lock, WAIT_LOCK, NOWAIT_LOCK,
)


cdef inline PyThread_type_lock new_lock() except NULL:
    cdef PyThread_type_lock lk = PyThread_allocate_lock()
    if lk == NULL:
        raise MemoryError("cannot allocate a lock")
    return lk


cdef inline void acquire(PyThread_type_lock lk) noexcept:
    if not PyThread_acquire_lock(lk, NOWAIT_LOCK):
        with nogil:
            PyThread_acquire_lock(lk, WAIT_LOCK)


cdef inline void release(PyThread_type_lock lk) noexcept:
    PyThread_release_lock(lk)
