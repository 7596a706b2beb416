"""Build and runtime configuration report."""
import platform
import sys

import numpy as np


def config_dict():
    """Build facts as a dict: version, OpenMP, threads, compiler flags, SIMD dispatch."""
    from pagedcy import _threads, __version__
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
    }


def show_config(file=None):
    """Print pagedcy's version, OpenMP on/off, thread count, SIMD path and build flags."""
    for key, value in config_dict().items():
        print(f"{key:>12}: {value}", file=file or sys.stdout)
