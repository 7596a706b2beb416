"""Build and runtime configuration report."""
import os
import platform
import sys

import numpy as np

THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
CPUINFO = "/proc/cpuinfo"
CPU_CACHES = "/sys/devices/system/cpu/cpu0/cache"

# /proc/cpuinfo keys naming the CPU: x86 ("model name"), POWER ("cpu"), some ARM boards
# ("Model", "Hardware"), s390 ("processor 0" lines carry no name: "vendor_id").
_MODEL_KEYS = ("model name", "cpu model", "Model", "Hardware", "cpu", "vendor_id")
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def cpu_model(path=CPUINFO):
    """The CPU's model name from ``/proc/cpuinfo`` (``platform.processor()`` or
    ``"unknown"`` where that file is missing or names no model)."""
    found = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if sep and value and key in _MODEL_KEYS and key not in found:
                    found[key] = value
    except OSError:
        pass
    for key in _MODEL_KEYS:
        if key in found:
            return " ".join(found[key].split())
    return platform.processor() or "unknown"


def cpu_caches(path=CPU_CACHES):
    """Cache sizes of the first core from sysfs, in bytes: ``{"L1d": ..., "L1i": ...,
    "L2": ..., "L3": ...}`` (the levels present; empty where sysfs has no cache data).
    A shared cache's size is the whole cache, not a core's share."""
    out = {}
    try:
        names = sorted(n for n in os.listdir(path) if n.startswith("index"))
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(path, name, "level")) as f:
                level = int(f.read())
            with open(os.path.join(path, name, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(path, name, "size")) as f:
                size = f.read().strip()
            nbytes = int(size.rstrip("KMG")) * _UNITS[size[len(size.rstrip("KMG")):]]
        except (OSError, ValueError, KeyError):
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        out[f"L{level}{suffix}"] = nbytes
    return out


def _size(nbytes):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def cpu_description(cpuinfo=CPUINFO, caches=CPU_CACHES):
    """One line naming the CPU and its caches, e.g. ``"AMD EPYC (L1d 32 KiB, L1i 32 KiB,
    L2 1 MiB, L3 32 MiB)"``; the model alone where the cache sizes are unknown."""
    sizes = cpu_caches(caches)
    model = cpu_model(cpuinfo)
    if not sizes:
        return model
    return f"{model} ({', '.join(f'{k} {_size(v)}' for k, v in sizes.items())})"


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
    """Build facts as a dict: version, CPU, OpenMP, threads and wait policy, compiler flags,
    SIMD dispatch."""
    from pagedcy import __version__
    from pagedcy._libs import _threads, wait_policy
    return {
        "pagedcy": __version__,
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_description(),
        "openmp": _threads.openmp_enabled(),
        "openmp_runtime": _threads.openmp_runtime() or "-",
        "max_threads": _threads.max_threads(),
        "num_threads": _threads.resolve_num_threads(None),
        "build_flags": _threads.build_flags(),
        "simd": _threads.simd_path(),
        "wait_policy": wait_policy(),
        "huge_pages": huge_pages(),
    }


def show_config(file=None):
    """Print pagedcy's version, the CPU, OpenMP on/off, thread count, SIMD path and build flags."""
    for key, value in config_dict().items():
        print(f"{key:>12}: {value}", file=file or sys.stdout)
