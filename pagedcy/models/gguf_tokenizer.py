"""The tokenizer a GGUF file describes in its metadata, built with ``tokenizers``.

A GGUF carries no tokenizer.json: ``tokenizer.ggml.*`` keys hold the vocabulary, scores or
merges and the token types. This rebuilds the pipeline transformers' GGUF converter builds
(``transformers/integrations/gguf/gguf_tokenizer_mapping.py`` with the Llama, Gemma and GPT-2
tokenizer classes), so ids and text agree with ``AutoTokenizer.from_pretrained(dir,
gguf_file=...)``:

- ``llama`` (SentencePiece): a BPE with byte fallback whose merges are recovered from the
  vocabulary, best score first; Metaspace pre-tokenizer (``add_space_prefix`` honoured).
  Gemma 3 files: merges ranked by file order and spaces-only tokens respelled with U+2581;
- ``gpt2`` (byte-level BPE): the file's merges, split by the regex ``tokenizer.ggml.pre`` names;
  for the Llama 3 names a piece that is a whole token is taken as is (``ignore_merges``, as in
  Llama 3's tokenizer.json and llama.cpp), which transformers' converter omits.

Control tokens (type 3) become special added tokens (skipped by ``decode(...,
skip_special_tokens=True)``), user-defined ones (type 4) plain added tokens; bos/eos are
added per ``tokenizer.ggml.add_bos_token`` / ``add_eos_token``.
"""
from __future__ import annotations


import numpy as np

__all__ = ["SUPPORTED_PRE_TOKENIZERS", "build_tokenizer", "gguf_tokenizer"]

_CONTROL, _USER_DEFINED = 3, 4

_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

_LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")

#: ``tokenizer.ggml.pre`` -> split regex (None: GPT-2's own, inside ByteLevel).
SUPPORTED_PRE_TOKENIZERS = {
    "default": None, "gpt2": None,
    "llama-bpe": _LLAMA3_SPLIT, "llama3": _LLAMA3_SPLIT, "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT, "dbrx": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT, "deepseek-r1-qwen": _QWEN2_SPLIT,
    "tekken": _TEKKEN_SPLIT,
}


def _tokens(md):
    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise ValueError("GGUF metadata 'tokenizer.ggml.tokens' must be a non-empty array of strings")
    return tokens


def _numbers(md, key, n, kind):
    v = md.get(key)
    if v is None:
        return None
    if not isinstance(v, np.ndarray) or v.ndim != 1 or v.dtype.kind not in kind or len(v) != n:
        raise ValueError(f"GGUF metadata {key!r} must be a numeric array of {n} entries")
    return v


def _token_id(md, key, n):
    v = md.get(f"tokenizer.ggml.{key}_token_id")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < n:
        raise ValueError(f"GGUF metadata 'tokenizer.ggml.{key}_token_id' must be a token id "
                         f"below {n}, got {v!r}")
    return v


def _flag(md, key, default):
    v = md.get(key, default)
    if not isinstance(v, bool):
        raise ValueError(f"GGUF metadata {key!r} must be a bool, got {type(v).__name__}")
    return v


def _merges_from_scores(vocab, scores):
    """Every split of every token into two vocabulary tokens, best-scored token first (the
    merge order SentencePiece's scores imply; transformers' ``generate_merges``)."""
    merges = []
    for token, score in scores.items():
        local = [(token[:i], token[i:], score) for i in range(1, len(token))
                 if token[:i] in vocab and token[i:] in vocab]
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        merges.extend(local)
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _bpe(models, **kwargs):
    """``tokenizers.models.BPE(**kwargs)``; its bare Exception (e.g. a merge naming a token
    the vocabulary lacks) becomes a ValueError."""
    try:
        return models.BPE(**kwargs)
    except Exception as e:  # noqa: BLE001 - tokenizers raises plain Exception
        raise ValueError(f"GGUF tokenizer metadata does not form a BPE model: {e}") from None


def _spm(md, tokens, gemma):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

    if gemma:   # spaces-only tokens are stored as spaces; the pipeline spells them U+2581
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    if gemma:   # Gemma's scores do not follow its merge order; file order does
        scores = {t: -i for i, t in enumerate(tokens)}
    else:
        raw = _numbers(md, "tokenizer.ggml.scores", len(tokens), "fiu")
        if raw is None:
            raise ValueError("GGUF metadata 'tokenizer.ggml.scores' is missing (a llama tokenizer needs it)")
        scores = dict(zip(tokens, raw.tolist()))
    unk = "<unk>" if gemma and "<unk>" in vocab else None
    tok = Tokenizer(_bpe(models, vocab=vocab, merges=_merges_from_scores(vocab, scores),
                         fuse_unk=True, byte_fallback=True, unk_token=unk))
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        prefix = _flag(md, "tokenizer.ggml.add_space_prefix", True)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False)
        if prefix:
            steps.append(decoders.Strip(content=" ", left=1, right=0))
    tok.decoder = decoders.Sequence(steps)
    return tok, tokens


def _byte_level(md, tokens):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = md.get("tokenizer.ggml.pre", "default")
    if not isinstance(pre, str) or pre not in SUPPORTED_PRE_TOKENIZERS:
        raise ValueError(f"unsupported GGUF pre-tokenizer 'tokenizer.ggml.pre' = {pre!r}; "
                         f"supported: {', '.join(SUPPORTED_PRE_TOKENIZERS)}")
    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise ValueError("GGUF metadata 'tokenizer.ggml.merges' must be an array of strings")
    pairs = [tuple(m.split(" ")) for m in merges]
    if any(len(p) != 2 for p in pairs):
        raise ValueError("GGUF metadata 'tokenizer.ggml.merges' entries must be two tokens "
                         "separated by one space")
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    # a token spelled outside the byte alphabet is respelled byte by byte, as transformers does
    tokens = [t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8"))
              for t in tokens]
    # Llama 3 splits look a whole piece up before merging (tokenizer.json's ignore_merges;
    # llama.cpp's llama-vocab.cpp sets it for these names); transformers' converter does not
    tok = Tokenizer(_bpe(models, vocab={t: i for i, t in enumerate(tokens)}, merges=pairs,
                         continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                         ignore_merges=pre in _LLAMA3_NAMES))
    split = SUPPORTED_PRE_TOKENIZERS[pre]
    if split is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok, tokens


def _bytes_to_unicode():
    """GPT-2's byte -> printable character table (the byte-level alphabet)."""
    from pagedcy.engine.tokenizer import byte_level_alphabet

    return {b: c for c, b in byte_level_alphabet().items()}


def build_tokenizer(metadata: dict):
    """``(tokenizers.Tokenizer, config)`` from GGUF metadata; ``config`` has the
    tokenizer_config.json-style ``chat_template``, ``bos_token``, ``eos_token`` (str or None).
    ValueError for a missing/mistyped key or an unsupported tokenizer model or pre-tokenizer."""
    from tokenizers import AddedToken, processors

    md = metadata
    model = md.get("tokenizer.ggml.model")
    tokens = _tokens(md)
    n = len(tokens)
    if model == "llama":
        tok, spelled = _spm(md, tokens, md.get("general.architecture") == "gemma3")
    elif model == "gpt2":
        tok, spelled = _byte_level(md, tokens)
    else:
        raise ValueError(f"unsupported GGUF tokenizer model 'tokenizer.ggml.model' = {model!r}; "
                         "supported: llama (SentencePiece), gpt2 (byte-level BPE)")
    types = _numbers(md, "tokenizer.ggml.token_type", n, "iu")
    types = types.tolist() if types is not None else [1] * n
    byte_alphabet = set(_bytes_to_unicode().values()) if model == "gpt2" else None
    control = [AddedToken(t, normalized=False, special=True) for t, k in zip(spelled, types)
               if k == _CONTROL and (byte_alphabet is None or set(t) <= byte_alphabet)]
    tok.add_special_tokens(control)
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(spelled, types) if k == _USER_DEFINED])
    ids = {k: _token_id(md, k, n) for k in ("bos", "eos", "unknown", "padding")}
    named = {k: spelled[i] for k, i in ids.items() if i is not None}
    # the named specials are special even when the file types them as normal (transformers)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in named.values()
                            if t not in {a.content for a in control}])
    # without the flag llama.cpp adds BOS for SentencePiece and Llama 3 vocabularies
    bos_default = model == "llama" or md.get("tokenizer.ggml.pre") in _LLAMA3_NAMES
    add_bos = _flag(md, "tokenizer.ggml.add_bos_token", bos_default) and "bos" in named
    add_eos = _flag(md, "tokenizer.ggml.add_eos_token", False) and "eos" in named
    single = " ".join(([named["bos"] + ":0"] if add_bos else []) + ["$A:0"]
                      + ([named["eos"] + ":0"] if add_eos else []))
    specials = [(named[k], ids[k]) for k, on in (("bos", add_bos), ("eos", add_eos)) if on]
    pair = single + (f" {named['bos']}:1" if add_bos else "") + " $B:1" + (
        f" {named['eos']}:1" if add_eos else "")
    tok.post_processor = processors.TemplateProcessing(single=single, pair=pair,
                                                       special_tokens=specials)
    template = md.get("tokenizer.chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError("GGUF metadata 'tokenizer.chat_template' must be a string")
    config = {"chat_template": template, "bos_token": named.get("bos"),
              "eos_token": named.get("eos")}
    return tok, config


def gguf_tokenizer(metadata: dict):
    """The pagedcy :class:`~pagedcy.engine.tokenizer.Tokenizer` of GGUF metadata."""
    from pagedcy.engine.tokenizer import Tokenizer

    backend, config = build_tokenizer(metadata)
    return Tokenizer.from_backend(backend, config)
