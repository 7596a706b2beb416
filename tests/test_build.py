"""The tests must exercise the compiled extension, not a pure-Python stand-in."""
import glob
import importlib
import importlib.machinery
import inspect
import io
import os
import sys

import pytest

import pagedcy
from pagedcy import KVPageStore, PagedKVCache, PagePool, PageTable
from pagedcy._libs import _threads

LIBS = os.path.dirname(_threads.__file__)
# Every .pyx in pagedcy/_libs (the wheel ships them) is a compiled module of its own.
EXT_MODULES = sorted("pagedcy._libs." + os.path.basename(f)[:-4]
                     for f in glob.glob(os.path.join(LIBS, "*.pyx")))


def test_every_core_module_is_listed():
    assert {"_pool", "_table", "_store", "_cache", "_attention", "_manager_ops", "_threads",
            "_bandwidth"} <= {m.rsplit(".", 1)[1] for m in EXT_MODULES}


@pytest.mark.parametrize("name", EXT_MODULES)
def test_every_extension_has_a_pxd_and_a_stub(name):
    base = os.path.join(LIBS, name.rsplit(".", 1)[1])
    assert os.path.exists(base + ".pxd"), f"{base}.pxd is missing"
    assert os.path.exists(base + ".pyi"), f"{base}.pyi is missing"


@pytest.mark.parametrize("name", EXT_MODULES)
def test_extension_modules_are_compiled_libraries(name):
    mod = importlib.import_module(name)
    assert mod.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), mod.__file__
    assert isinstance(mod.__loader__, importlib.machinery.ExtensionFileLoader)


def _instances():
    cfg = pagedcy.PagedKVCacheConfig(4, 2, 1, 1, 4)
    return [PagePool(2, 4), PageTable(4), KVPageStore(cfg), PagedKVCache(cfg)]


@pytest.mark.parametrize("idx", range(4))
def test_core_classes_are_extension_types(idx):
    obj = _instances()[idx]
    cls = type(obj)
    assert type(cls).__name__ == "type"
    assert cls.__module__ in EXT_MODULES
    # A Python-defined class gives instances a __dict__ and its methods are Python functions.
    assert "__dict__" not in cls.__dict__, f"{cls.__name__} looks like a pure-Python class"
    assert not hasattr(obj, "__dict__")
    methods = [m for m in vars(cls) if not m.startswith("_")]
    assert methods
    for m in methods:
        assert not inspect.isfunction(vars(cls)[m]), f"{cls.__name__}.{m} is a Python function"


def test_cache_instances_reject_new_attributes():
    cache = PagedKVCache(pagedcy.PagedKVCacheConfig(4, 2, 1, 1, 4))
    with pytest.raises(AttributeError):
        cache.some_new_attribute = 1


def test_openmp_enabled_matches_the_build(monkeypatch):
    # openmp_enabled() reports the PAGEDCY_OPENMP macro; the flags are what setup.py
    # passed the compiler, and a build with OpenMP has its runtime loaded.
    monkeypatch.delenv("PAGEDCY_NUM_THREADS", raising=False)
    on = pagedcy.openmp_enabled()
    assert on is ("-fopenmp" in _threads.build_flags()), (on, _threads.build_flags())
    if on:
        assert pagedcy.resolve_num_threads(3) == 3
        if sys.platform.startswith("linux"):
            with open("/proc/self/maps") as f:
                maps = f.read()
            assert "libgomp" in maps or "libomp" in maps
    else:
        assert _threads.max_threads() == 1 and pagedcy.resolve_num_threads(3) == 1


def test_show_config_prints_the_build_facts():
    buf = io.StringIO()
    pagedcy.show_config(file=buf)
    out = buf.getvalue().lower()
    assert pagedcy.__version__.lower() in out
    assert "openmp" in out and str(pagedcy.openmp_enabled()).lower() in out
    assert "thread" in out
    assert "flags" in out and "-o3" in out


def test_show_config_defaults_to_stdout(capsys):
    pagedcy.show_config()
    assert "openmp" in capsys.readouterr().out.lower()


def test_resolve_num_threads_honours_argument(monkeypatch):
    monkeypatch.delenv("PAGEDCY_NUM_THREADS", raising=False)
    got = pagedcy.resolve_num_threads(3)
    assert got == (3 if pagedcy.openmp_enabled() else 1)
    assert pagedcy.resolve_num_threads(1) == 1
    assert pagedcy.resolve_num_threads(None) >= 1


def test_resolve_num_threads_honours_environment(monkeypatch):
    monkeypatch.setenv("PAGEDCY_NUM_THREADS", "2")
    assert pagedcy.resolve_num_threads() == (2 if pagedcy.openmp_enabled() else 1)
    # An explicit argument wins over the environment.
    assert pagedcy.resolve_num_threads(1) == 1


@pytest.mark.parametrize("bad", [0, -1, -100])
def test_resolve_num_threads_rejects_non_positive(bad, monkeypatch):
    monkeypatch.delenv("PAGEDCY_NUM_THREADS", raising=False)
    with pytest.raises(ValueError):
        pagedcy.resolve_num_threads(bad)


@pytest.mark.parametrize("bad", ["x", 1.5, None.__class__, True])
def test_resolve_num_threads_rejects_non_integers(bad, monkeypatch):
    monkeypatch.delenv("PAGEDCY_NUM_THREADS", raising=False)
    with pytest.raises(TypeError):
        pagedcy.resolve_num_threads(bad)


@pytest.mark.parametrize("env", ["0", "-1", "x", "2.5"])
def test_resolve_num_threads_rejects_bad_environment(env, monkeypatch):
    monkeypatch.setenv("PAGEDCY_NUM_THREADS", env)
    with pytest.raises(ValueError):
        pagedcy.resolve_num_threads()
