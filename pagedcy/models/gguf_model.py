"""read_gguf: a GGUF model file as a Hugging Face config, generation config, tokenizer and
memory-mapped tensors under HF names.

    from pagedcy.models.gguf_model import read_gguf
    with read_gguf("model.gguf") as f:
        cfg = ModelConfig.from_dict(f.config_dict, f.generation)
        w = f.tensors["model.layers.0.self_attn.q_proj.weight"]   # GGUFTensor, raw rows
        tok = f.tokenizer()
        x = f.get("model.norm.weight", (cfg.hidden_size,))          # float32, dequantized
"""
from __future__ import annotations

import os

import numpy as np

from pagedcy.models.gguf_config import config_from_metadata, generation_from_metadata, hf_tensors
from pagedcy.models.gguf_file import GGUFFile, GGUFTensor

__all__ = ["GGUFModelFile", "read_gguf"]


class GGUFModelFile:
    """A parsed GGUF model (build with :func:`read_gguf`).

    ``config_dict``: the config.json dict (``architectures``, ``hidden_size``, ...);
    ``generation``: a generation_config.json-style dict (``bos_token_id``, ``eos_token_id``
    list); ``tensors``: dict HF parameter name -> :class:`GGUFTensor` (rows of the file's
    encoding, views of its memory map except where noted in
    :func:`pagedcy.models.gguf_config.hf_tensors`); ``chat_template`` (str or None);
    ``metadata``: the raw GGUF metadata dict; ``file_size`` (bytes); ``path``.
    """

    def __init__(self, gguf: GGUFFile, hf_norms: bool = True):
        self._file = gguf
        self.path = gguf.path
        self.file_size = gguf.file_size
        self.metadata = gguf.metadata
        self.config_dict = config_from_metadata(gguf)
        self.generation = generation_from_metadata(gguf)
        self.tensors: dict[str, GGUFTensor] = hf_tensors(gguf, self.config_dict, hf_norms)
        template = gguf.metadata.get("tokenizer.chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError("GGUF metadata 'tokenizer.chat_template' must be a string")
        self.chat_template = template

    def names(self) -> list[str]:
        """HF names of the file's tensors, in file order."""
        return list(self.tensors)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def shape(self, name: str) -> tuple[int, ...]:
        """Logical (HF-order) shape of tensor ``name``."""
        return self.tensor(name).shape

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> GGUFTensor:
        """The :class:`GGUFTensor` ``name``; ValueError if the file lacks it or (with
        ``shape``) its shape differs, naming it."""
        t = self.tensors.get(name)
        if t is None:
            raise ValueError(f"GGUF file {self.path!r} has no tensor {name!r}")
        if shape is not None and t.shape != tuple(shape):
            raise ValueError(f"tensor {name!r} has shape {list(t.shape)}, expected {list(shape)}")
        return t

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """Tensor ``name`` dequantized to a new float32 array of its HF shape (checked against
        ``shape``): the interface of :class:`pagedcy.models.weights.CheckpointReader`."""
        return self.tensor(name, shape).dequantize()

    def get_stored(self, name: str, shape: tuple[int, ...] | None = None):
        """``(stored, fmt)`` of tensor ``name`` as the file holds it, no copy: F32 as float32,
        F16 as float16, BF16 as uint16 bit patterns (``fmt`` "float32" / "float16" /
        "bfloat16"), a block format as its raw rows uint8 ``[N, row_bytes]`` with ``fmt`` the
        lower-case GGML type name: the interface :func:`pagedcy.models.loader.build_model`
        reads."""
        t = self.tensor(name, shape)
        plain = {0: ("<f4", "float32"), 1: ("<f2", "float16"), 30: ("<u2", "bfloat16")}
        if t.ggml_type in plain:
            dt, fmt = plain[t.ggml_type]
            return t.raw.view(dt).reshape(t.shape), fmt
        return t.raw, t.type_name.lower()

    def tokenizer(self):
        """The file's tokenizer as a pagedcy :class:`~pagedcy.engine.tokenizer.Tokenizer`
        (built on each call). ValueError if the metadata describes none pagedcy supports."""
        from pagedcy.models.gguf_tokenizer import gguf_tokenizer

        return gguf_tokenizer(self.metadata)

    def close(self) -> None:
        """Release the file (tensor views still held keep the mapping alive until dropped)."""
        self.tensors = {}
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_gguf(path: str | os.PathLike, *, hf_norms: bool = True) -> GGUFModelFile:
    """Open a GGUF model file: header checked, config and tensor names mapped, tensors
    memory-mapped (no tensor data is read). ``hf_norms``: see ``hf_tensors`` (Gemma 3 norm
    weights as ``w`` rather than the file's ``1 + w``). FileNotFoundError for a missing file;
    ValueError for a malformed file, an unsupported architecture, or a tensor of a type
    pagedcy does not load (naming the tensor and type)."""
    gguf = GGUFFile(path)
    try:
        return GGUFModelFile(gguf, hf_norms=hf_norms)
    except BaseException:
        gguf.close()
        raise
