"""KV storage dtypes: float32, float16 and bfloat16.

bfloat16 arrays use ``ml_dtypes.bfloat16`` when that package is installed and
raw ``uint16`` bit patterns otherwise (the kernels read either the same way).
"""
import numpy as np

#: Names accepted for the KV storage dtype, mapped to the C dtype code used by the kernels.
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}


def _ml_bfloat16():
    try:
        import ml_dtypes  # type: ignore[import-not-found]
    except ImportError:
        return None
    return np.dtype(ml_dtypes.bfloat16)


def normalize_dtype(dtype):
    """Return the canonical storage-dtype name ('float32', 'float16' or 'bfloat16').

    Accepts those names, NumPy dtypes/types (``np.float32``, ``np.float16``) and
    ``ml_dtypes.bfloat16``. Raises TypeError for anything else.
    """
    if isinstance(dtype, str):
        name = dtype.lower()
        aliases = {"f32": "float32", "fp32": "float32", "f16": "float16", "fp16": "float16",
                   "half": "float16", "bf16": "bfloat16"}
        name = aliases.get(name, name)
        if name in DTYPE_CODES:
            return name
        raise TypeError(f"unsupported KV dtype {dtype!r}; use float32, float16 or bfloat16")
    try:
        d = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"unsupported KV dtype {dtype!r}; use float32, float16 or bfloat16") from None
    if d.name in DTYPE_CODES:
        return d.name
    raise TypeError(f"unsupported KV dtype {d}; use float32, float16 or bfloat16")


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
    """Bytes per stored value."""
    return 4 if normalize_dtype(name) == "float32" else 2
