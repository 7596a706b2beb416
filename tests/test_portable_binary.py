"""The compiled library must run on any x86-64: VEX/AVX instructions only inside the
functions chosen at run time (those compiled with an ``avx2``/``avx512``/``f16c`` target
attribute)."""
import glob
import os
import platform
import re
import shutil
import subprocess

import pytest

import pagedcy

pytestmark = pytest.mark.skipif(
    platform.machine() not in ("x86_64", "AMD64") or shutil.which("objdump") is None,
    reason="objdump on x86-64 needed to inspect the instructions")

# Functions allowed to hold VEX-encoded instructions: the run-time-dispatched SIMD kernels.
ALLOWED = re.compile(r"avx2|avx512|f16c|fma", re.IGNORECASE)
FUNC = re.compile(r"^[0-9a-f]+ <(?P<name>[^>]+)>:$")


def _libraries():
    root = os.path.join(os.path.dirname(pagedcy.__file__), "_libs")
    return sorted(glob.glob(os.path.join(root, "*.so")))


def vex_outside_dispatch(path):
    """(function, mnemonic) pairs of VEX instructions found outside allowed functions."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", path], capture_output=True,
                         text=True, check=True).stdout
    bad, func = [], "?"
    for line in out.splitlines():
        m = FUNC.match(line)
        if m:
            func = m.group("name")
            continue
        parts = line.split("\t")
        if len(parts) < 2:
            continue
        mnemonic = parts[1].split()[0] if parts[1].split() else ""
        # vzeroupper is the ABI-mandated exit of AVX code; only inside allowed functions too.
        if mnemonic.startswith("v") and mnemonic not in ("verr", "verw") and not ALLOWED.search(func):
            bad.append((func, mnemonic))
    return bad


def test_extension_libraries_present():
    assert _libraries(), "no compiled extension found in pagedcy/_libs"


@pytest.mark.skipif(os.environ.get("PAGEDCY_NATIVE", "") not in ("", "0"),
                    reason="a PAGEDCY_NATIVE=1 build uses -march=native on purpose")
@pytest.mark.parametrize("lib", _libraries(), ids=os.path.basename)
def test_no_avx_outside_runtime_dispatch(lib):
    bad = vex_outside_dispatch(lib)
    assert not bad, f"{os.path.basename(lib)}: VEX instructions outside dispatched code: {bad[:10]}"
