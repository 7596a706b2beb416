"""Build script for pagedcy's Cython extensions.

OpenMP is probed at build time by compiling and linking a tiny ``#pragma omp
parallel`` program; when that fails (e.g. Apple clang without libomp) or when
``PAGEDCY_NO_OPENMP=1`` is set, everything builds serially.  ``PAGEDCY_NATIVE=1``
opts in to ``-march=native`` (never on by default: wheels must stay portable;
the SIMD kernels are chosen at run time instead).  ``PAGEDCY_SANITIZE=1`` builds
with ``-fsanitize=address,undefined`` for the sanitizer CI job.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
OMP_PROBE = r"""
#include <omp.h>
#include <stdio.h>
int main(void) {
    int n = 0;
    #pragma omp parallel reduction(+:n)
    n += 1;
    printf("%d\n", n > 0 && omp_get_max_threads() > 0);
    return 0;
}
"""


def _flag(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _openmp_flags(compiler_cmd):
    """Return (compile_args, link_args) for OpenMP, or None when it does not work."""
    if _flag("PAGEDCY_NO_OPENMP"):
        print("pagedcy: PAGEDCY_NO_OPENMP set, building without OpenMP (serial kernels)")
        return None
    candidates = [(["-fopenmp"], ["-fopenmp"])]
    if sys.platform == "darwin":
        for prefix in ("/opt/homebrew/opt/libomp", "/usr/local/opt/libomp"):
            if os.path.isdir(prefix):
                candidates.append(
                    ([f"-Xpreprocessor", "-fopenmp", f"-I{prefix}/include"],
                     [f"-L{prefix}/lib", "-lomp"]))
    tmp = tempfile.mkdtemp(prefix="pagedcy-omp-")
    try:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(OMP_PROBE)
        for cflags, lflags in candidates:
            exe = os.path.join(tmp, "probe")
            cmd = compiler_cmd + cflags + [src, "-o", exe] + lflags
            try:
                subprocess.run(cmd, check=True, capture_output=True, timeout=120)
                out = subprocess.run([exe], check=True, capture_output=True, timeout=60)
                if out.stdout.strip() == b"1":
                    return cflags, lflags
            except (OSError, subprocess.SubprocessError):
                continue
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("pagedcy: NOTICE: the C compiler cannot build OpenMP programs; "
          "building without OpenMP (kernels run serially)")
    return None


class BuildExt(build_ext):
    """build_ext that adds the OpenMP / native / sanitizer flags it detects."""

    def build_extensions(self):
        cc = self.compiler.compiler_so or [sysconfig.get_config_var("CC") or "cc"]
        compiler_cmd = [cc[0]] if isinstance(cc, list) else [cc]
        omp = _openmp_flags(compiler_cmd)
        cflags = ["-O3", "-fno-strict-aliasing", "-std=gnu11"]
        lflags = []
        if omp:
            cflags += omp[0]
            lflags += omp[1]
        if _flag("PAGEDCY_NATIVE"):
            cflags.append("-march=native")
        if _flag("PAGEDCY_SANITIZE"):
            cflags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer",
                       "-fno-sanitize-recover=undefined", "-O1", "-g"]
            lflags += ["-fsanitize=address,undefined"]
        cflags = [f for f in cflags if not (self.compiler.compiler_type == "msvc")]
        build_flags = " ".join(dict.fromkeys(cflags + lflags))
        # show_config() reports exactly what this build used.
        for ext in self.extensions:
            ext.extra_compile_args = cflags + list(ext.extra_compile_args or [])
            ext.extra_link_args = lflags + list(ext.extra_link_args or [])
            ext.define_macros = list(ext.define_macros or []) + [
                ("PAGEDCY_OPENMP", "1" if omp else "0"),
                ("PAGEDCY_BUILD_FLAGS", '"%s"' % build_flags.replace('"', "")),
            ]
        super().build_extensions()


def extensions():
    exts = []
    for pyx in sorted(glob.glob(os.path.join("pagedcy", "_libs", "*.pyx"))):
        name = "pagedcy._libs." + os.path.splitext(os.path.basename(pyx))[0]
        # _quant's quantizers must round x * id + 8.5 twice, as gguf-py does: no contraction
        # into FMA (its decoders are exact either way, pagedcy_quant.h says why).
        extra = ["-ffp-contract=off"] if name == "pagedcy._libs._quant" else []
        exts.append(Extension(
            name, [pyx], extra_compile_args=extra,
            include_dirs=[np.get_include(), os.path.join("pagedcy", "_libs", "src")],
            define_macros=[("NPY_NO_DEPRECATED_API", "NPY_2_0_API_VERSION")],
            depends=glob.glob(os.path.join("pagedcy", "_libs", "src", "*.h")),
        ))
    return cythonize(
        exts,
        compiler_directives={
            "language_level": 3,
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
            "embedsignature": True,
            "freethreading_compatible": False,
        },
        include_path=["."],
        nthreads=int(os.environ.get("PAGEDCY_CYTHON_JOBS", "0")) or None,
    )


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
