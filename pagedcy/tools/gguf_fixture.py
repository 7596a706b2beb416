"""Write small GGUF files from Hugging Face checkpoints, as llama.cpp's converter would (tests).

    write_gguf(hf_dir, "model.gguf", tensor_type="Q8_0")            # tokenizer.json's BPE
    write_gguf(hf_dir, "model.gguf", spm_model="tok.model")         # a SentencePiece vocab

Follows ``convert_hf_to_gguf.py``: tensor names from gguf-py's ``TensorNameMap`` (not from
pagedcy's reader, so a test of the reader checks an independent mapping), Llama q/k rows
permuted, Gemma 3 norms stored as ``1 + w``, llama3 RoPE scaling as ``rope_freqs.weight``,
1-D tensors kept float32. Quantized types are those ``gguf.quants`` can write.
Needs ``gguf``, ``safetensors`` (and ``sentencepiece`` for an SPM vocab).
"""
from __future__ import annotations

import json
import math
import os

from typing import Any

import numpy as np

__all__ = ["write_gguf", "write_vocab_gguf", "train_sentencepiece", "SPM_CORPUS", "WRITABLE_TYPES"]

#: Tensor types this writer can produce.
WRITABLE_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
_ARCHS = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
          "gemma3_text": "gemma3", "gemma3": "gemma3"}

#: A varied corpus for training a test SentencePiece model (scripts, emoji, code, digits).
SPM_CORPUS = [
    "The quick brown fox jumps over the lazy dog.", "Hello, world! How are you today?",
    "Numbers: 0 1 2 3 42 1234567890 3.14159 -17 +8e-3", "def f(x):\n    return x ** 2  # square",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }", "Ünïcödé: café, naïve, Straße, Ørsted, façade",
    "日本語のテキストです。東京は大きい都市です。", "中文文本：你好，世界！我们今天学习。",
    "한국어 문장입니다. 안녕하세요!", "Русский текст: привет, мир.", "Emoji: 😀 🚀 🎉 👍🏽 ❤️",
    "Tabs\tand\t\tspaces    and\n\nnewlines", "    indented line with four spaces",
    "URLs like https://example.com/path?q=1&r=2 and emails a.b@c.org",
    "Mixed: abc123def 456ghi <tag> [x] {y} (z) 'quote' \"double\"",
    "a paged key-value cache stores keys and values of each token in fixed-size pages",
]


def train_sentencepiece(prefix: str | os.PathLike, vocab_size: int = 500,
                        model_type: str = "bpe", gemma: bool = False) -> str:
    """Train a byte-fallback SentencePiece model on :data:`SPM_CORPUS`; returns the path of
    ``<prefix>.model``. ``<unk>``/``<s>``/``</s>`` at ids 0/1/2, a control ``<|ctrl|>`` and a
    user-defined ``<tool>``; with ``gemma``, Gemma's layout instead: ``<pad>``/``<eos>``/
    ``<bos>``/``<unk>`` at 0-3, then ``<mask>``, ``<start_of_turn>``, ``<end_of_turn>``."""
    import sentencepiece as spm

    lines = SPM_CORPUS * 20
    ids: dict[str, Any] = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    control = ["<|ctrl|>"]
    if gemma:
        ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>",
                   bos_piece="<bos>")
        control = ["<mask>", "<start_of_turn>", "<end_of_turn>"]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=os.fspath(prefix), vocab_size=vocab_size,
        model_type=model_type, byte_fallback=True, character_coverage=0.98,
        user_defined_symbols=["<tool>"], control_symbols=control, **ids,
        split_digits=True, allow_whitespace_only_pieces=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        hard_vocab_limit=False, minloglevel=2, num_threads=1)
    return os.fspath(prefix) + ".model"


def _hf_tensors(hf_dir):
    from safetensors.numpy import load_file

    out = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            out.update(load_file(os.path.join(hf_dir, name)))
    return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}


def _permute(w, heads):
    """convert_hf_to_gguf.LlamaModel.permute: interleave the two rotary halves of each head."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _llama3_factors(rope, head_dim, theta):
    """convert_hf_to_gguf.LlamaModel.generate_extra_tensors: per-frequency llama3 factors."""
    factor, low = rope.get("factor", 8.0), rope.get("low_freq_factor", 1.0)
    high, old = rope.get("high_freq_factor", 4.0), rope.get("original_max_position_embeddings", 8192)
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(out, dtype=np.float32)


def _add(writer, name, data, qtype_name, encoder=None):
    import gguf
    from gguf.quants import quantize

    encoded = None if encoder is None or data.ndim == 1 else encoder(name, data, qtype_name)
    if encoded is not None:
        raw, qtype = encoded
        writer.add_tensor(name, raw, raw_dtype=qtype)
    elif data.ndim == 1 or qtype_name == "F32":
        writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    elif qtype_name == "F16":
        writer.add_tensor(name, data.astype(np.float16))
    else:
        qtype = gguf.GGMLQuantizationType[qtype_name]
        writer.add_tensor(name, quantize(data, qtype), raw_dtype=qtype)


def _bpe_vocab(writer, hf_dir, pre):
    import gguf

    tok = json.load(open(os.path.join(hf_dir, "tokenizer.json"), encoding="utf-8"))
    vocab = dict(tok["model"]["vocab"])
    special = {}
    for a in tok.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        special[a["id"]] = a.get("special", False)
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    tokens = [t if t is not None else f"[PAD{i}]" for i, t in enumerate(tokens)]
    types = [gguf.TokenType.CONTROL if special.get(i) else
             gguf.TokenType.USER_DEFINED if i in special else gguf.TokenType.NORMAL
             for i in range(len(tokens))]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    cfg_path = os.path.join(hf_dir, "tokenizer_config.json")
    cfg = json.load(open(cfg_path, encoding="utf-8")) if os.path.isfile(cfg_path) else {}
    for key, add in (("bos_token", writer.add_bos_token_id), ("eos_token", writer.add_eos_token_id),
                     ("unk_token", writer.add_unk_token_id), ("pad_token", writer.add_pad_token_id)):
        if isinstance(cfg.get(key), str) and cfg[key] in vocab:
            add(vocab[cfg[key]])
    writer.add_add_bos_token(bool(cfg.get("add_bos_token", False)))
    writer.add_add_eos_token(bool(cfg.get("add_eos_token", False)))
    return cfg.get("chat_template"), len(tokens)


def _spm_vocab(writer, model_path):
    """convert_hf_to_gguf.TextModel._create_vocab_sentencepiece, for one model file."""
    import gguf
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    sp = spm.SentencePieceProcessor(model_file=os.fspath(model_path))
    proto = pb.ModelProto()
    proto.ParseFromString(open(model_path, "rb").read())
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        types.append(gguf.TokenType.UNKNOWN if sp.is_unknown(i) else
                     gguf.TokenType.CONTROL if sp.is_control(i) else
                     gguf.TokenType.UNUSED if sp.is_unused(i) else
                     gguf.TokenType.BYTE if sp.is_byte(i) else
                     gguf.TokenType.USER_DEFINED if proto.pieces[i].type == 4 else
                     gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_add_space_prefix(proto.normalizer_spec.add_dummy_prefix)
    for sid, add in ((sp.bos_id(), writer.add_bos_token_id), (sp.eos_id(), writer.add_eos_token_id),
                     (sp.unk_id(), writer.add_unk_token_id), (sp.pad_id(), writer.add_pad_token_id)):
        if sid >= 0:
            add(sid)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    return len(tokens)


def write_gguf(hf_dir, out_path, *, tensor_type: str = "F32", spm_model=None,
               pre_tokenizer: str = "gpt2", chat_template: str | None = None,
               types: dict[str, str] | None = None, encoder=None) -> str:
    """Convert the checkpoint in ``hf_dir`` (config.json + float32 safetensors) to a GGUF file.

    ``tensor_type``: the type of 2-D weights (one of :data:`WRITABLE_TYPES`; 1-D stay F32);
    ``types``: per-HF-name overrides. ``encoder(gguf_name, data, type_name)``, when given, may
    return ``(raw uint8 rows, GGMLQuantizationType)`` to write a 2-D tensor in a type this
    writer cannot produce itself (None: the usual path). Tokenizer: ``spm_model`` (a SentencePiece ``.model``
    file) or else the checkpoint's ``tokenizer.json`` (byte-level BPE, written with
    ``pre_tokenizer`` as ``tokenizer.ggml.pre``). ``chat_template`` overrides the one from
    tokenizer_config.json. Returns ``out_path``.
    """
    import gguf

    if tensor_type not in WRITABLE_TYPES:
        raise ValueError(f"tensor_type must be one of {WRITABLE_TYPES}, got {tensor_type!r}")
    cfg = json.load(open(os.path.join(hf_dir, "config.json"), encoding="utf-8"))
    arch = _ARCHS[cfg["model_type"]]
    layers = cfg["num_hidden_layers"]
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim") or hidden // heads
    w = gguf.GGUFWriter(os.fspath(out_path), arch)
    w.add_name(os.path.basename(os.fspath(hf_dir)))
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    theta = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0))
    if arch == "gemma3":
        rp = cfg.get("rope_parameters") or {}
        theta = (rp.get("full_attention") or {}).get("rope_theta", cfg.get("rope_theta", 1e6))
        w.add_sliding_window(cfg["sliding_window"])
    w.add_rope_freq_base(theta)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
    if cfg.get("head_dim") or arch == "gemma3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tensors = _hf_tensors(hf_dir)
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters") or {}
    if arch == "llama" and rope.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", _llama3_factors(rope, head_dim, theta))
    names = gguf.get_tensor_name_map(next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch),
                                     layers)
    for hf, data in tensors.items():
        name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for {hf!r}")
        if arch == "llama" and ".self_attn.q_proj." in hf:
            data = _permute(data, heads)
        elif arch == "llama" and ".self_attn.k_proj." in hf:
            data = _permute(data, kv_heads)
        if arch == "gemma3" and hf.endswith("norm.weight"):
            data = data + np.float32(1.0)
        _add(w, name, data, (types or {}).get(hf, tensor_type), encoder)
    _vocab(w, hf_dir, spm_model, pre_tokenizer, chat_template)
    return _finish(w, out_path)


def _vocab(w, hf_dir, spm_model, pre_tokenizer, chat_template):
    template = None
    if spm_model is not None:
        _spm_vocab(w, spm_model)
    else:
        template, _ = _bpe_vocab(w, hf_dir, pre_tokenizer)
    template = chat_template if chat_template is not None else template
    if template is not None:
        w.add_chat_template(template)


def _finish(w, out_path):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(out_path)


def write_vocab_gguf(out_path, arch: str = "llama", *, hf_dir=None, spm_model=None,
                     pre_tokenizer: str = "gpt2", chat_template: str | None = None,
                     metadata: dict | None = None) -> str:
    """A GGUF holding only a tokenizer (``spm_model`` or ``hf_dir``'s tokenizer.json, as
    :func:`write_gguf`), ``general.architecture`` = ``arch`` and string/int/float/bool
    ``metadata`` extras; no tensors. Returns ``out_path``."""
    import gguf

    w = gguf.GGUFWriter(os.fspath(out_path), arch)
    w.add_block_count(1)
    for key, value in (metadata or {}).items():
        adder: dict[type, Any] = {str: w.add_string, bool: w.add_bool, int: w.add_uint32, float: w.add_float32}
        adder[type(value)](key, value)
    _vocab(w, hf_dir, spm_model, pre_tokenizer, chat_template)
    return _finish(w, out_path)
