"""KV storage dtypes: float32, float16, bfloat16 and int8.

bfloat16 arrays use ``ml_dtypes.bfloat16`` when that package is installed and
raw ``uint16`` bit patterns otherwise (the kernels read either the same way).

int8 is symmetric quantization per (token, KV head): each head row of a page
holds ``head_dim`` int8 values ``q`` followed by the row's float32 scale ``s``
(4 bytes, native byte order), so a page array has ``head_dim + 4`` int8
elements on its last axis and the row stands for ``q * s`` with
``s = max|x| / 127``. Writes quantize (NaN stores 0, +-Inf saturate to +-127
of the row's scale, which comes from the row's finite values only).
"""
import numpy as np

#: Names accepted for the KV storage dtype, mapped to the C dtype code used by the kernels.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2, "int8": 3}

#: Bytes after the head_dim values of an int8 head row (its float32 scale).
INT8_SCALE_BYTES = 4
_SUPPORTED = "use float32, float16, bfloat16 or int8"


def _ml_bfloat16():
    try:
        import ml_dtypes  # type: ignore[import-not-found]
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def normalize_dtype(dtype):
    """Return the canonical storage-dtype name ('float32', 'float16', 'bfloat16' or 'int8').

    Accepts those names, NumPy dtypes/types (``np.float32``, ``np.float16``) and
    ``ml_dtypes.bfloat16``. Raises TypeError for anything else.
    """
    if isinstance(dtype, str):
        name = dtype.lower()
        aliases = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                   "half": "float16", "bf16": "bfloat16", "i8": "int8"}
        name = aliases.get(name, name)
        if name in DTYPE_CODES:
            return name
        raise TypeError(f"unsupported KV dtype {dtype!r}; {_SUPPORTED}")
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unsupported KV dtype {dtype!r}; {_SUPPORTED}") from None
    if d.name in DTYPE_CODES:
        return d.name
    raise TypeError(f"unsupported KV dtype {d}; {_SUPPORTED}")


def storage_dtype(name):
    """NumPy dtype used for arrays of storage dtype ``name`` (bf16 → ml_dtypes or uint16)."""
    name = normalize_dtype(name)
    if name == "bfloat16":
        bf = _ml_bfloat16()
        return bf if bf is not None else np.dtype(np.uint16)
    return np.dtype(name)


def dtype_code(dtype):
    """Kernel dtype code for a storage-dtype name or NumPy dtype (uint16 means raw bf16)."""
    if isinstance(dtype, np.dtype) and dtype == np.uint16:
        return DTYPE_CODES["bfloat16"]
    return DTYPE_CODES[normalize_dtype(dtype)]


def itemsize(name):
    """Bytes per stored element (int8: 1; its head rows also carry a scale)."""
    return {"float32": 4, "int8": 1}.get(normalize_dtype(name), 2)


def head_row_elems(name, head_dim):
    """Stored elements of one (token, KV head) row: ``head_dim``, plus the scale's
    ``INT8_SCALE_BYTES`` for int8."""
    return head_dim + (INT8_SCALE_BYTES if normalize_dtype(name) == "int8" else 0)


def quantize_int8(x):
    """NumPy version of the int8 write path: float ``[..., head_dim]`` -> int8 rows
    ``[..., head_dim + 4]`` (values, then the float32 scale's bytes), bit-identical to
    what a store with ``dtype="int8"`` writes."""
    x = np.asarray(x, dtype=np.float32)
    D = x.shape[-1]
    a = np.abs(x)
    amax = np.where(np.isfinite(a), a, np.float32(0)).max(axis=-1, keepdims=True)
    scale = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
        y = np.rint(x * inv)
    y = np.where(np.isinf(x), np.where(amax > 0, np.sign(x) * 127, 0), y)
    rows = np.empty(x.shape[:-1] + (D + INT8_SCALE_BYTES,), np.int8)
    rows[..., :D] = np.clip(np.nan_to_num(y, nan=0.0), -127, 127)
    rows[..., D:] = scale.view(np.int8)
    return rows


def dequantize_int8(rows):
    """int8 rows ``[..., head_dim + 4]`` -> the float32 values ``[..., head_dim]`` they stand for."""
    rows = np.ascontiguousarray(rows, dtype=np.int8)
    D = rows.shape[-1] - INT8_SCALE_BYTES
    scale = np.ascontiguousarray(rows[..., D:]).view(np.float32)
    return rows[..., :D].astype(np.float32) * scale
