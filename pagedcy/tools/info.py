"""Build and runtime configuration report."""
import platform
import sys

import numpy as np

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"


def huge_pages(path=THP_ENABLED):
    """Whether page pools can sit on 2 MiB pages: the kernel's transparent-huge-page mode
    (``"always"``, ``"madvise"``, ``"never"``, or ``"unavailable"`` off Linux) and whether
    NumPy, whose allocator makes every pool, asks for them.

    Random page order touches a new 4 KiB page at every step; on 2 MiB pages the TLB covers
    the pool. Measured on the headline decode (``asv_benches/huge_pages.py``, four runs):
    float16 3-6% slower on 4 KiB pages, float32 from 1% faster to 7% slower.
    """
    try:
        with open(path) as f:
            words = f.read().split()
        mode = next((w[1:-1] for w in words if w.startswith("[") and w.endswith("]")), "unavailable")
    except OSError:
        mode = "unavailable"
    if mode != "madvise":
        return mode
    core = getattr(np, "_core", None) or np.core      # numpy 2 renamed it; 1.x has only core
    asks = getattr(core.multiarray, "_get_madvise_hugepage", lambda: False)()
    return "madvise (numpy asks)" if asks else "madvise (numpy does not ask: base pages)"


def config_dict():
    """Build facts as a dict: version, OpenMP, threads and wait policy, compiler flags, SIMD dispatch."""
    from pagedcy import __version__
    from pagedcy._libs import _threads, wait_policy
    return {
        "pagedcy": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "openmp": _threads.openmp_enabled(),
        "max_threads": _threads.max_threads(),
        "num_threads": _threads.resolve_num_threads(None),
        "build_flags": _threads.build_flags(),
        "simd": _threads.simd_path(),
        "wait_policy": wait_policy(),
        "huge_pages": huge_pages(),
    }


def show_config(file=None):
    """Print pagedcy's version, OpenMP on/off, thread count, SIMD path and build flags."""
    for key, value in config_dict().items():
        print(f"{key:>12}: {value}", file=file or sys.stdout)
