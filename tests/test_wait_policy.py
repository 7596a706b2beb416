"""The OpenMP wait policy pagedcy picks at import (pagedcy/_libs/__init__.py), each case in a
fresh interpreter because the runtime reads its environment once, when it loads."""
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from pagedcy import _libs
from pagedcy._libs import _openmp_runtimes, _threads

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_DISPLAY_ENV")
REPORT = ("import json, os, pagedcy, pagedcy._libs as L; "
          "print(json.dumps([os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'), "
          "L.wait_policy(), pagedcy.tools.info.config_dict()['wait_policy']]))")

SPIN = dict(_libs._OURS)["GOMP_SPINCOUNT"]           # what pagedcy sets
SET_BY_PAGEDCY = f"OMP_WAIT_POLICY=passive GOMP_SPINCOUNT={SPIN} (set by pagedcy)"

needs_openmp = pytest.mark.skipif(not _threads.openmp_enabled(), reason="serial build")


def run(code, args=(), **env_add):
    env = {k: v for k, v in os.environ.items() if k not in VARS}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(env_add)
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1]), out.stderr


def spincount_read(stderr):
    """GOMP_SPINCOUNT as libgomp itself reports it under OMP_DISPLAY_ENV=verbose (None when
    the runtime is not libgomp)."""
    for line in stderr.splitlines():
        if line.strip().startswith("GOMP_SPINCOUNT ="):
            return line.split("=", 1)[1].strip().strip("'")
    return None


@needs_openmp
def test_default_sets_passive_and_the_runtime_reads_it():
    (policy, spin, text, shown), err = run(REPORT, OMP_DISPLAY_ENV="verbose")
    assert policy == "passive" and spin == SPIN
    assert text == shown == SET_BY_PAGEDCY
    read = spincount_read(err)
    if read is not None:                  # libgomp: a short spin (its default is 300000)
        assert read == SPIN, err


@needs_openmp
@pytest.mark.parametrize("var, value", [("OMP_WAIT_POLICY", "active"), ("GOMP_SPINCOUNT", "1234"),
                                        ("KMP_BLOCKTIME", "5")])
def test_a_user_setting_wins(var, value):
    (policy, spin, text, _), err = run(REPORT, OMP_DISPLAY_ENV="verbose", **{var: value})
    assert text == f"as set by the user: {var}={value}"
    assert policy == (value if var == "OMP_WAIT_POLICY" else None)   # nothing added beside it
    if var == "GOMP_SPINCOUNT" and spincount_read(err) is not None:
        assert spincount_read(err) == "1234"


# pagedcy's own runtime, and bound ahead of the global scope (not under ASan, which refuses
# RTLD_DEEPBIND: there a runtime loaded first serves pagedcy, as with a shared libgomp)
OWN_RUNTIME = (os.path.basename(_threads.openmp_runtime()) == "libpagedcy_gomp.so.1"
               and _libs._DEEPBIND)
DECODE = ("import sys, pagedcy; from pagedcy.models import write_random_checkpoint; "
          "llm = pagedcy.LLM(write_random_checkpoint(sys.argv[1], seed=0), num_threads=2); "
          "llm.generate(['a b c'], pagedcy.SamplingParams(max_tokens=3), use_tqdm=False); ")
SHOW = ("import json, os, pagedcy, pagedcy._libs as L; from pagedcy._libs import _threads; "
        "from pagedcy.tools.info import config_dict; _threads._display_openmp_env(); "
        "print(json.dumps([L.wait_policy(), os.path.basename(_threads.openmp_runtime()), "
        "config_dict()['openmp_runtime']]))")


def last_spincount(stderr):
    """The last GOMP_SPINCOUNT a libgomp printed (``_display_openmp_env`` prints pagedcy's
    runtime's last), or None."""
    found = [ln.split("=", 1)[1].strip().strip("'") for ln in stderr.splitlines()
             if ln.strip().startswith("GOMP_SPINCOUNT =")]
    return found[-1] if found else None


@needs_openmp
def test_runtime_loaded_first():
    """`import torch; import pagedcy`, imitated: a libgomp.so.1 loaded into the global scope and
    initialised first. With pagedcy's own runtime the policy still applies; with a shared one
    it cannot, is reported, and must not linger in os.environ."""
    lib = ctypes.util.find_library("gomp")
    if lib is None or _openmp_runtimes() is None:
        pytest.skip("no libgomp to preload / no /proc/self/maps")
    code = f"import ctypes; ctypes.CDLL({lib!r}, mode=ctypes.RTLD_GLOBAL); " + REPORT
    (policy, spin, text, _), err = run(code, OMP_DISPLAY_ENV="verbose")
    if OWN_RUNTIME:
        assert (policy, spin) == ("passive", SPIN)
        assert text == SET_BY_PAGEDCY
        return
    assert policy is None and spin is None
    assert text.startswith("runtime default: an OpenMP runtime was loaded before pagedcy (libgomp")
    read = spincount_read(err)
    assert read is None or read == "300000"    # the runtime kept its spinning default


@needs_openmp
@pytest.mark.skipif(not OWN_RUNTIME, reason="this build links the shared libgomp")
def test_torch_first_leaves_pagedcy_its_own_runtime_and_policy(tmp_path):
    """The real thing: torch's wheel loads its libgomp.so.1 (spinning default) into the global
    scope; a decode step's parallel regions still run on pagedcy's runtime, which read
    pagedcy's policy (info reports it)."""
    pytest.importorskip("torch")
    (text, runtime, shown), err = run("import torch; " + DECODE + SHOW, args=[str(tmp_path)])
    assert runtime == "libpagedcy_gomp.so.1" and shown.endswith("libpagedcy_gomp.so.1")
    assert text == SET_BY_PAGEDCY
    assert last_spincount(err) == SPIN, err


def test_openmp_runtimes_reads_the_maps_file(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 11 /usr/lib/x86_64-linux-gnu/libgomp.so.1.0.0\n"
        "7f02-7f03 r-xp 00000000 08:01 12 /site/torch/lib/libgomp.so.1\n"
        "7f04-7f05 r-xp 00000000 08:01 13 /site/scikit_learn.libs/libgomp-a34b3233.so.1.0.0\n"
        "7f06-7f07 r-xp 00000000 08:01 14 /opt/llvm/lib/libomp.so\n"
        "7f08-7f09 r-xp 00000000 08:01 15 /usr/lib/libgompish/notaruntime.so\n"
        "7f0a-7f0b rw-p 00000000 00:00 0 \n"
        "7f0c-7f0d r-xp 00000000 08:01 16 /lib/libc.so.6\n")
    found = {os.path.basename(p.strip()) for p in _openmp_runtimes(str(maps))}
    assert found == {"libgomp.so.1.0.0", "libgomp.so.1", "libgomp-a34b3233.so.1.0.0", "libomp.so"}
    assert _openmp_runtimes(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("message, translated", [
    ("/x/torch/lib/libgomp.so.1: version `OMP_5.1' not found (required by /x/_threads.so)", True),
    ("/x/libgomp.so.1: version `GOMP_5.0' not found (required by /x/_attention.so)", True),
    ("libfoo.so: cannot open shared object file", False),
])
def test_an_older_runtime_loaded_first_is_named_as_the_cause(message, translated):
    """A build linking the shared libgomp (built without patchelf), imported after torch loaded
    its older libgomp, fails in the dynamic loader with a symbol-version message: the
    ImportError must name the cause and the remedies; other ImportErrors pass through."""
    code = ("import importlib, json, sys\n"
            "real = importlib.import_module\n"
            "def fake(name, *a):\n"
            "    if name == 'pagedcy._libs._threads':\n"
            "        raise ImportError(sys.argv[1])\n"
            "    return real(name, *a)\n"
            "importlib.import_module = fake\n"
            "try:\n"
            "    import pagedcy\n"
            "except ImportError as e:\n"
            "    print(json.dumps([str(e), str(e.__cause__)]))\n")
    (msg, cause), _ = run(code, (message,))
    assert message in msg and message in cause if translated else msg == message
    assert ("import pagedcy before torch" in msg and "patchelf" in msg) == translated
