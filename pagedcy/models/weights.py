"""Reading a checkpoint's tensors (safetensors, single file or sharded) as NumPy arrays.

F32, F16 and BF16 tensors are supported, as float32 (``get``) or as stored (``get_stored``:
16-bit tensors as their bit patterns, never widened). NumPy has no bfloat16: with
``ml_dtypes`` installed safetensors hands BF16 tensors over directly; without it, a file
holding BF16 tensors is read through ``safetensors.deserialize`` as raw bytes.
"""
from __future__ import annotations

import os

import numpy as np

from pagedcy._validate import read_json_object
from pagedcy.models.linear import aligned_copy

__all__ = ["CheckpointReader", "bf16_bits_to_f32", "to_bf16_bits"]

SUPPORTED_DTYPES = ("F32", "F16", "BF16")


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16, any shape) to float32 (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) and return the uint16 bit patterns."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def _has_ml_dtypes():
    try:
        import ml_dtypes  # noqa: F401  (registers 'bfloat16' with NumPy)
    except ImportError:
        return False
    return True


#: Tensors from this size up are copied into NumPy's own memory (see get_stored).
_OWN_COPY_BYTES = 4 << 20


class CheckpointReader:
    """Tensors of a Hugging Face checkpoint directory by name, as float32.

    ``model.safetensors`` or ``model.safetensors.index.json`` + shards. FileNotFoundError
    when the directory has neither (or a shard is missing); ValueError for a corrupt file,
    a missing tensor or an unsupported dtype, naming it.
    """

    def __init__(self, path: str | os.PathLike):
        try:
            from safetensors import safe_open
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise ImportError("loading checkpoints needs the 'safetensors' package") from e
        self._safe_open = safe_open
        self.path = os.fspath(path)
        self._handles: dict[str, object] = {}
        self._raw: dict[str, dict] = {}
        self._bf16_native = _has_ml_dtypes()
        self._files = self._shard_map()

    def _shard_map(self) -> dict[str, str]:
        single = os.path.join(self.path, "model.safetensors")
        index = os.path.join(self.path, "model.safetensors.index.json")
        if os.path.isfile(single):
            return {name: single for name in self._open(single).keys()}
        if not os.path.isfile(index):
            raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in "
                                    f"{self.path!r}")
        weight_map = read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index} is not a valid safetensors index: 'weight_map' must map "
                             f"tensor names to file names")
        files = {str(k): os.path.join(self.path, v) for k, v in weight_map.items()}
        for shard in sorted(set(files.values())):
            if not os.path.isfile(shard):
                raise FileNotFoundError(f"shard {shard!r} named by {index} is missing")
        return files

    def _open(self, file):
        h = self._handles.get(file)
        if h is None:
            with open(file, "rb"):  # PermissionError and the like as themselves, not "corrupt"
                pass
            try:
                h = self._safe_open(file, framework="numpy")
            except Exception as e:  # SafetensorError is not exported as a stable class
                raise ValueError(f"corrupt safetensors file {file!r}: {e}") from None
            self._handles[file] = h
        return h

    def names(self) -> list[str]:
        """All tensor names in the checkpoint."""
        return list(self._files)

    def __contains__(self, name: str) -> bool:
        return name in self._files

    def shape(self, name: str) -> tuple[int, ...]:
        """Shape of tensor ``name`` without reading it."""
        return tuple(self._slice(name).get_shape())

    def _slice(self, name):
        if name not in self._files:
            raise ValueError(f"tensor {name!r} is missing from the checkpoint in {self.path!r}")
        file = self._files[name]
        try:
            return self._open(file).get_slice(name)
        except ValueError:
            raise
        except Exception as e:     # SafetensorError: an index naming the wrong shard
            raise ValueError(f"tensor {name!r} cannot be read from {file!r}: {e}") from None

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor ``name`` as a float32 array, checked against ``shape`` when given."""
        arr, fmt = self.get_stored(name, shape)
        if fmt == "bfloat16":
            return bf16_bits_to_f32(arr)
        return np.ascontiguousarray(arr, dtype=np.float32)

    def get_stored(self, name: str, shape: tuple[int, ...] | None = None) -> tuple[np.ndarray, str]:
        """Tensor ``name`` as stored, with its format: ``(float32 array, "float32")``,
        ``(float16 array, "float16")`` or ``(uint16 bit patterns, "bfloat16")``. No float32
        copy of a 16-bit tensor is made."""
        sl = self._slice(name)
        dtype, got = sl.get_dtype(), tuple(sl.get_shape())
        if dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"tensor {name!r} has dtype {dtype}; supported: "
                             f"{', '.join(SUPPORTED_DTYPES)}")
        if shape is not None and got != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {list(got)}, expected {list(shape)}")
        file = self._files[name]
        try:
            if dtype == "BF16" and not self._bf16_native:
                arr = self._raw_tensor(file, name)
            else:
                arr = self._open(file).get_tensor(name)
        except ValueError:
            raise
        except Exception as e:
            raise ValueError(f"cannot read tensor {name!r} from {file!r}: {e}") from None
        fmt = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}[dtype]
        if not arr.flags.owndata and (arr.nbytes >= _OWN_COPY_BYTES or arr.ctypes.data % 64):
            # safetensors hands back a view of a bytes object: malloc'd in 4 KiB pages, and
            # rarely 64-byte aligned. NumPy's own allocation asks for huge pages, and a decode
            # step streams these weights: a 272 MB bf16 LM head ran at 19 GB/s from the bytes
            # and 28 GB/s from a copy (Intel Xeon, 2 threads); the GEMM loads rows 64 bytes at
            # a time (linear.aligned_copy). One tensor's bytes are freed before the next is
            # read, so the copy costs no memory.
            arr = aligned_copy(arr, always=arr.nbytes >= _OWN_COPY_BYTES)
        if fmt == "bfloat16":
            arr = arr.view(np.uint16)     # ml_dtypes' bfloat16 or the raw path's uint16
        return np.ascontiguousarray(arr), fmt

    def _raw_tensor(self, file, name):
        raw = self._raw.get(file)
        if raw is None:
            from safetensors import deserialize
            with open(file, "rb") as f:
                raw = {k: v for k, v in deserialize(f.read())}
            self._raw = {file: raw}  # one file's bytes at a time
        entry = raw[name]
        return np.frombuffer(entry["data"], dtype="<u2").reshape(entry["shape"])
