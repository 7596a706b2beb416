"""How a checkpoint's tensors are held in RAM: the ``dtype`` and ``quantization`` load options.

vLLM's names and meanings:

- ``dtype="auto"`` (default): each matrix as the file stores it: F32 as float32
  (:class:`~pagedcy.models.linear.DenseWeight`), F16/BF16 as their 16-bit patterns
  (:class:`~pagedcy.models.linear.HalfWeight`, half the RAM and the bytes a decode step
  reads; compute stays float32, and widening 16 bits to float32 is exact, so the logits are
  those of ``dtype="float32"``).
- ``dtype="float32"``: every matrix widened to float32 (4 bytes a parameter).
- ``dtype="bfloat16"`` / ``"float16"``: every matrix stored in that format; F32 (or the other
  16-bit format) tensors are rounded to it at load (nearest even). float16 refuses a tensor
  past its range (ValueError).
- ``quantization="q8_0"`` / ``"q4_0"``: the projections and the LM head (with tied
  embeddings, the shared table) are quantized at load to GGUF's block format (``gguf.quants``;
  their in-features must be a multiple of 32) and held as
  :class:`~pagedcy.models.linear.BlockWeight`; an untied embedding table follows ``dtype``.

Norm weights and biases are always float32 vectors. A tensor a reader hands over already in
a block format (a GGUF file's Q4_K, Q6_K, ...: ``fmt`` its lower-case GGML type name, ``stored``
its raw rows uint8 ``[N, row_bytes]``) is held as it is, whatever ``dtype`` and
``quantization`` say.

``activation_dtype`` says what a block-format matrix multiplies:

- ``"auto"`` (default): int8 activations for every block format, as llama.cpp computes them:
  each row of x is quantized per 32 elements and multiplied with integer dot products on
  weights repacked at load into 16-row panels (:class:`~pagedcy.models.linear.PanelWeight`,
  ``pagedcy._libs._q8panel``; each output within ``sum_g max|x_g| / 254 * sum_g |w|`` of the
  float32 result).
- ``"float32"``: float32 activations everywhere (bit for bit the float32 GEMM on the
  dequantized weights).

The loaders apply the same choice to attention over an int8 KV cache: with ``"auto"`` the
model's decode queries are rounded to int8 and scored with integer dot products
(``CausalLM.quantize_query``), as llama.cpp quantizes q for a quantized cache.
"""
from __future__ import annotations

import numpy as np

from pagedcy.models.linear import (PANEL_FORMATS, BlockWeight, DenseWeight, HalfWeight,
                                   PanelWeight, Weight)
from pagedcy.models.weights import bf16_bits_to_f32, to_bf16_bits

__all__ = ["DTYPES", "QUANTIZATIONS", "ACTIVATION_DTYPES", "FLOAT_FORMATS", "WeightStorage",
           "check_load_options"]

DTYPES = ("auto", "float32", "float16", "bfloat16")
FLOAT_FORMATS = ("float32", "float16", "bfloat16")
QUANTIZATIONS = (None, "q8_0", "q4_0")
ACTIVATION_DTYPES = ("auto", "float32")


def check_load_options(dtype, quantization, activation_dtype="auto") -> None:
    """ValueError (listing the choices) for an unknown ``dtype``, ``quantization`` or
    ``activation_dtype``."""
    if not isinstance(activation_dtype, str) or activation_dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation_dtype must be one of {', '.join(ACTIVATION_DTYPES)}, "
                         f"got {activation_dtype!r}")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if quantization is not None and (not isinstance(quantization, str)
                                     or quantization not in QUANTIZATIONS):
        raise ValueError(f"quantization must be None or one of "
                         f"{', '.join(q for q in QUANTIZATIONS if q)}, got {quantization!r}")


def widen(stored: np.ndarray, fmt: str) -> np.ndarray:
    """A float32 array of the values of ``stored`` (format ``fmt``, as CheckpointReader
    returns them)."""
    if fmt == "bfloat16":
        return bf16_bits_to_f32(stored)
    return np.ascontiguousarray(stored, dtype=np.float32)


class WeightStorage:
    """Builds each tensor's in-RAM object under the ``dtype`` / ``quantization`` options
    (see the module docstring). ``matrix`` for projections and the LM head, ``table`` for an
    untied embedding table (norms and biases are float32 arrays, not weights)."""

    def __init__(self, dtype: str = "auto", quantization: str | None = None,
                 activation_dtype: str = "auto"):
        check_load_options(dtype, quantization, activation_dtype)
        self.dtype, self.quantization = dtype, quantization
        self.activation_dtype = activation_dtype

    def _blocks(self, raw, qtype, cols=None) -> Weight:
        """A block-format matrix that multiplies: int8 activations on panels where the format
        has them and ``activation_dtype`` is "auto", else the raw rows."""
        fmt = qtype if isinstance(qtype, str) else qtype.name
        if self.activation_dtype == "auto" and fmt.lower() in PANEL_FORMATS:
            return PanelWeight(raw, qtype, cols)
        return BlockWeight(raw, qtype, cols)

    def table(self, stored: np.ndarray, fmt: str, name: str = "tensor") -> Weight:
        """A 2-D ``stored`` matrix (format ``fmt``, as CheckpointReader.get_stored returns
        it) held per ``dtype`` (never quantized): an embedding table, read by row lookups
        only (a block format keeps its raw rows, memory-mapped from a GGUF file)."""
        if fmt not in FLOAT_FORMATS:
            return BlockWeight(stored, fmt)
        want = fmt if self.dtype == "auto" else self.dtype
        if want == "float32":
            return DenseWeight(widen(stored, fmt))
        if want == fmt:
            return HalfWeight(stored, fmt)
        values = widen(stored, fmt)
        if want == "bfloat16":
            return HalfWeight(to_bf16_bits(values), "bfloat16")
        with np.errstate(over="ignore"):
            half = values.astype(np.float16)
        if not np.isfinite(half).all() and np.isfinite(values).all():
            raise ValueError(f"{name} has values outside float16's range (65504): load it with "
                             f"dtype='bfloat16' or 'auto'")
        return HalfWeight(half)

    def matrix(self, stored: np.ndarray, fmt: str, name: str = "tensor") -> Weight:
        """A projection ``stored`` ``[N, K]`` (format ``fmt``): quantized when
        ``quantization`` is set, else as :meth:`table`."""
        if fmt not in FLOAT_FORMATS:
            return self._blocks(stored, fmt)
        if self.quantization is None:
            return self.table(stored, fmt, name)
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import quantize
        except ImportError as e:  # pragma: no cover - a declared dependency
            raise ImportError("quantization needs the 'gguf' package") from e
        qtype = GGMLQuantizationType[self.quantization.upper()]
        cols = stored.shape[1]
        if cols % 32:
            raise ValueError(f"quantization={self.quantization!r} needs in-features that are a "
                             f"multiple of 32; {name} has {cols}")
        return self._blocks(quantize(widen(stored, fmt), qtype), qtype, cols)
