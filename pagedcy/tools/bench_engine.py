"""Engine benchmark helpers: the machine header every engine/interleave table starts with."""
import glob
import os
import platform

# the variables that change how fast a run is: thread pools, wait policies, BLAS kernels
ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "OPENBLAS_", "MKL_", "PAGEDCY_", "GOTO", "BLIS_")


def cpu_model():
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cache_sizes():
    """CPU 0's caches as text, e.g. ``"L1d 32K, L1i 32K, L2 1024K, L3 32768K (shared by 0-1)"``."""
    parts = []
    for d in sorted(glob.glob("/sys/devices/system/cpu/cpu0/cache/index*")):
        try:
            def read(name):
                with open(os.path.join(d, name)) as f:
                    return f.read().strip()
            level, kind, size = read("level"), read("type"), read("size")
            shared = read("shared_cpu_list")
        except OSError:
            continue
        tag = f"L{level}" + {"Data": "d", "Instruction": "i"}.get(kind, "")
        parts.append(f"{tag} {size}" + (f" (shared by {shared})" if "-" in shared or "," in shared else ""))
    return ", ".join(parts) or "unknown"


def thread_pools():
    """Loaded thread pools (threadpoolctl): ``"openblas SkylakeX x2 (libscipy_openblas...)"`` each."""
    try:
        import threadpoolctl
    except ImportError:
        return ["threadpoolctl not installed"]
    out = []
    for i in threadpoolctl.threadpool_info():
        arch = f" {i['architecture']}" if i.get("architecture") else ""
        out.append(f"{i['internal_api']}{arch} x{i['num_threads']} ({os.path.basename(i['filepath'])})")
    return out


def run_env():
    """The performance-relevant environment variables as set, ``NAME=value`` each."""
    return [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)]


def machine_header():
    """Multi-line header: CPU, caches, BLAS/OpenMP pools, thread counts, pagedcy's OpenMP
    wait policy and the environment as run. Imports numpy (for the BLAS) and pagedcy."""
    import numpy as np
    from pagedcy.tools.info import config_dict
    cfg = config_dict()
    env = run_env()
    return "\n".join([
        f"CPU: {cpu_model()} ({os.cpu_count()} logical CPUs); caches: {cache_sizes()}",
        f"numpy {np.__version__}; thread pools: {'; '.join(thread_pools())}",
        f"pagedcy {cfg['pagedcy']}: threads {cfg['num_threads']}, SIMD {cfg['simd']}, "
        f"OpenMP wait policy: {cfg.get('wait_policy', 'n/a')}",
        "env: " + (" ".join(env) if env else "(no OMP_/GOMP_/OPENBLAS_/MKL_/PAGEDCY_ variables set)"),
    ])
