"""Input validation shared by every Python-facing entry point.

Everything a ``nogil`` core trusts is checked here first: dtypes, shapes,
contiguity and integer ranges. This is the one place that decides which
exception a mistake raises, as NumPy does:

- TypeError: the wrong kind of object or dtype (``1.5``, ``"4"``, ``None`` or
  ``True`` where an integer belongs; an int array where floats belong);
- ValueError: the right kind with a bad value (a size or count out of range, a
  wrong shape);
- IndexError: an index outside the container it indexes (a page of a pool, a
  layer, a token position).

The compiled modules take exact ints in range on a C fast path
(``pagedcy/_libs/_args.pxd``) and hand everything else to these functions.
"""
import json
import math
import operator

import numpy as np


def as_int(value, name):
    """``value`` as a Python int (TypeError for bools, floats and non-integers)."""
    if type(value) is int:         # the common case first: every kernel call passes a few
        return value
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


def check_index(value, upper, name):
    """``value`` as an int in ``[0, upper)``; IndexError otherwise."""
    v = as_int(value, name)
    if v < 0 or v >= upper:
        raise IndexError(f"{name} {v} out of range [0, {upper})")
    return v


#: Largest count/position accepted anywhere: keeps every C size computation far from overflow.
MAX_COUNT = 2**48


def check_count(value, name, upper=MAX_COUNT):
    """``value`` as an int in ``[0, upper]``; ValueError otherwise."""
    v = as_int(value, name)
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    if v > upper:
        raise ValueError(f"{name} {v} exceeds {upper}")
    return v


def check_positive(value, name, upper=None):
    """``value`` as an int in ``[1, upper)`` (no upper bound when ``upper`` is None);
    ValueError otherwise."""
    v = as_int(value, name)
    if v < 1:
        raise ValueError(f"{name} must be a positive integer, got {v}")
    if upper is not None and v >= upper:
        raise ValueError(f"{name} must be < {upper}, got {v}")
    return v


def int_array(x, name):
    """``x`` as a NumPy array of an integer dtype (bools, floats and strings are a TypeError)."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}")
    return arr


def index_array(x, name, upper):
    """``x`` as a C-contiguous int32 array of indices in ``[0, upper)`` (``upper <= 2**31``).

    TypeError for a non-integer dtype, IndexError for an entry out of range; the range is
    checked before narrowing, so ``2**32 + 1`` is refused instead of becoming 1.
    """
    arr = int_array(x, name)
    if arr.size and (arr.min() < 0 or arr.max() >= upper):
        bad = arr[(arr < 0) | (arr >= upper)].flat[0]
        raise IndexError(f"{name} holds {bad}, outside [0, {upper})")
    return np.ascontiguousarray(arr, dtype=np.int32)


def int32_array(x, name, shape):
    """``x`` as a C-contiguous int32 array of ``shape`` (a tuple; -1 matches any length).

    TypeError for a non-integer dtype, ValueError for another number of dimensions or a
    mismatched length, or for values that do not fit int32 (checked before narrowing).
    """
    arr = int_array(x, name)
    if arr.ndim != len(shape) or any(w >= 0 and g != w for g, w in zip(arr.shape, shape)):
        want = "[" + ", ".join("?" if w < 0 else str(w) for w in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(arr.shape)}")
    if arr.dtype != np.int32 and arr.size and (arr.min() < -2**31 or arr.max() >= 2**31):
        raise ValueError(f"{name} holds values outside int32")
    return np.ascontiguousarray(arr, dtype=np.int32)

def token_id_array(x, name):
    """``x`` as a NumPy array of token ids: an integer dtype, or empty. An empty list
    arrives as float64 and passes (lengths are checked by the caller); any other
    non-integer dtype (float, complex, bool, str, object) is a TypeError, raised
    before a cast could silently drop parts of it."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu" and (arr.size or arr.dtype.kind != "f"):
        raise TypeError(f"{name} must be integer token ids, got dtype {arr.dtype}")
    return arr


def float_array(x, name):
    """``x`` as a NumPy array of a real floating dtype (no copy when it already is one)."""
    arr = x if isinstance(x, np.ndarray) else np.asarray(x)
    kind = arr.dtype.kind
    if kind != "f" and arr.dtype.name != "bfloat16":
        raise TypeError(f"{name} must be a floating-point array, got dtype {arr.dtype}")
    return arr


def as_f32_rows(x, name, num_kv_heads, head_dim, n_rows=None, leading=()):
    """Token rows as a C-contiguous float32 array of shape ``leading + (n, kv_dim)``.

    Accepts ``leading + (n, kv_dim)`` or ``leading + (n, num_kv_heads, head_dim)``;
    with ``n_rows == 1`` and no leading axes also a single row ``(kv_dim,)`` or
    ``(num_kv_heads, head_dim)``. Other float dtypes are converted; non-float
    dtypes raise TypeError, wrong shapes ValueError.
    """
    arr = float_array(x, name)
    kv_dim = num_kv_heads * head_dim
    nl = len(leading)
    shape = arr.shape
    single = n_rows == 1 and nl == 0
    if single and shape in ((kv_dim,), (num_kv_heads, head_dim)):
        rows = arr.reshape(1, kv_dim)
    elif len(shape) == nl + 2 and shape[:nl] == tuple(leading) and shape[-1] == kv_dim:
        rows = arr
    elif (len(shape) == nl + 3 and shape[:nl] == tuple(leading)
          and shape[-2:] == (num_kv_heads, head_dim)):
        rows = arr.reshape(shape[:nl + 1] + (kv_dim,))
    else:
        want = f"{tuple(leading) + ('n', kv_dim)} or {tuple(leading) + ('n', num_kv_heads, head_dim)}"
        if single:
            want = f"({kv_dim},) or ({num_kv_heads}, {head_dim})"
        raise ValueError(f"{name} has shape {shape}; expected {want}")
    if n_rows is not None and rows.shape[nl] != n_rows:
        raise ValueError(f"{name} has {rows.shape[nl]} token rows, expected {n_rows}")
    return np.ascontiguousarray(rows, dtype=np.float32)


def check_out(out, shape, dtype, name="out"):
    """Check a caller-supplied output array: exact dtype, shape and C-contiguity, writable."""
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(out).__name__}")
    if out.dtype != dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype)}, got {out.dtype}")
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {out.shape}, expected {tuple(shape)}")
    if not out.flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return out


def finite_float(value, name, *, min_value=None):
    """``value`` as a finite Python float, ``>= min_value`` when given; TypeError for
    non-numbers, ValueError otherwise."""
    if type(value) is float and math.isfinite(value) and (min_value is None or value >= min_value):
        return value               # the common case (an eps or scale per kernel call)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a number, got bool")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None
    except OverflowError:          # an int past float's range
        v = float("inf")
    if not np.isfinite(v) or (min_value is not None and v < min_value):
        bound = f" >= {min_value}" if min_value is not None else ""
        raise ValueError(f"{name} must be a finite number{bound}, got {value}")
    return v


def int_array_nd(x, name, ndim):
    """``int_array(x, name)`` with exactly ``ndim`` dimensions (ValueError otherwise)."""
    arr = int_array(x, name)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    return arr



def read_json_object(path):
    """The JSON object (a dict) in the file ``path``. ValueError when the file is not
    UTF-8 JSON, nests too deeply for the parser or holds something other than an object;
    OSError (FileNotFoundError, PermissionError, ...) when it cannot be read."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, RecursionError) as e:     # JSONDecodeError and UnicodeDecodeError
        raise ValueError(f"{path} is not valid JSON: {type(e).__name__}: {str(e)[:200]}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, not {type(data).__name__}")
    return data
