"""Every public name of pagedcy has a docstring.

The pure-Python modules are read with ``ast`` (nothing is imported, so modules with
optional dependencies are checked too); the compiled ``pagedcy._libs`` modules are
imported and their public functions, classes and methods checked through ``__doc__``.
Public = not starting with ``_``, in a module whose path has no private part (``_libs``
is the exception: its modules are private by name but hold the public core types).
"""
import ast
import importlib
import inspect
import pathlib
import re
import textwrap

import pytest

import pagedcy

ROOT = pathlib.Path(pagedcy.__file__).parent
SUBPACKAGES = ("models", "engine", "serving", "tools", "server")
# Functions whose arrays the docstring must describe: an argument or the return value is
# annotated as an ndarray, so its shape/dtype belongs in the docstring.
SHAPE_WORDS = re.compile(r"\[[^\]]*\]|\(\w+, |shape|dtype|float32|int32|float64|int64|1-D|2-D")


def public_modules():
    """Paths of the public pure-Python modules: the top level and the subpackages."""
    paths = [p for p in sorted(ROOT.glob("*.py")) if not p.name.startswith("_") or p.name == "__init__.py"]
    for sub in SUBPACKAGES:
        for p in sorted((ROOT / sub).rglob("*.py")) if (ROOT / sub).is_dir() else ():
            rel = p.relative_to(ROOT / sub).parts
            if all(not part.startswith("_") or part in ("__init__.py", "__main__.py") for part in rel):
                paths.append(p)
    return paths


def _mentions_ndarray(node):
    anns = [a.annotation for a in node.args.args + node.args.kwonlyargs] + [node.returns]
    return any(a is not None and "ndarray" in ast.unparse(a) for a in anns)


def missing_docstrings(source, module="<module>"):
    """``module.name`` of every public function, class and public method in ``source``
    without a docstring (or, for a function taking or returning an annotated ndarray,
    without a word of its shape or dtype); the module itself when it has none."""
    tree = ast.parse(source)
    missing = [] if ast.get_docstring(tree) else [module]
    defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)

    def visit(body, prefix):
        for node in body:
            if not isinstance(node, defs) or node.name.startswith("_"):
                continue
            name = f"{prefix}.{node.name}"
            doc = ast.get_docstring(node)
            if not doc:
                missing.append(name)
            elif not isinstance(node, ast.ClassDef) and _mentions_ndarray(node) \
                    and not SHAPE_WORDS.search(doc):
                missing.append(name + " (no shape/dtype)")
            if isinstance(node, ast.ClassDef):
                visit(node.body, name)

    visit(tree.body, module)
    return missing


@pytest.mark.parametrize("path", public_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_public_python_names_have_docstrings(path):
    assert missing_docstrings(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) == []


def test_the_check_finds_what_is_missing():
    src = textwrap.dedent('''
        """Module."""
        import numpy as np
        def documented():
            """Yes."""
        def undocumented():
            pass
        def _private():
            pass
        class Thing:
            """A thing."""
            def method(self):
                pass
            def _helper(self):
                pass
            def rows(self) -> np.ndarray:
                """The rows."""
        class Bare:
            pass
    ''')
    assert missing_docstrings(src, "m") == ["m.undocumented", "m.Thing.method",
                                            "m.Thing.rows (no shape/dtype)", "m.Bare"]
    assert missing_docstrings("x = 1\n", "m") == ["m"]


def _doc_beyond_signature(obj, name):
    # Cython's embedsignature puts "name(args)" first: that alone is not a docstring.
    lines = [ln for ln in (getattr(obj, "__doc__", None) or "").strip().splitlines()
             if ln.strip() and not ln.strip().startswith(name + "(")]
    return bool(lines)


EXTENSIONS = sorted(p.name.split(".")[0] for p in (ROOT / "_libs").glob("*.pyx"))
READONLY = re.compile(r"^[ \t]*cdef[ \t]+(?:readonly|public)[ \t]+\w+[ \t]+([\w, \t]+?)[ \t]*(?:#.*)?$", re.M)


def readonly_attributes(name):
    """Names declared ``cdef readonly``/``cdef public`` in the module's .pxd: Cython gives
    such attributes no docstring; the class docstring and the .pyi stub describe them."""
    pxd = (ROOT / "_libs" / f"{name}.pxd").read_text(encoding="utf-8")
    return {a.strip() for m in READONLY.findall(pxd) for a in m.split(",")}


@pytest.mark.parametrize("name", EXTENSIONS)
def test_compiled_public_names_have_docstrings(name):
    mod = importlib.import_module(f"pagedcy._libs.{name}")
    missing = [] if mod.__doc__ else [name]
    readonly = readonly_attributes(name)
    for attr, obj in vars(mod).items():
        if attr.startswith("_") or getattr(obj, "__module__", None) != mod.__name__:
            continue
        if not _doc_beyond_signature(obj, attr):
            missing.append(attr)
        if inspect.isclass(obj):
            for meth, member in vars(obj).items():
                if meth.startswith("_") or meth in readonly:
                    continue
                if not _doc_beyond_signature(member, meth):
                    missing.append(f"{attr}.{meth}")
    assert missing == []
