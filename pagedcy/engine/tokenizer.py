"""A checkpoint's tokenizer (``tokenizer.json`` through the ``tokenizers`` library) and
incremental detokenization of generated tokens.

``tokenizers`` is imported only when a tokenizer is loaded, so ``import pagedcy`` stays
NumPy-only.
"""
import os

from pagedcy._validate import read_json_object

__all__ = ["Tokenizer", "IncrementalDetokenizer", "load_tokenizer"]

#: Prompt tokens given to a detokenizer as context (vLLM uses 5): enough for a
#: decoder to know whether the first generated token starts a word.
_CONTEXT_TOKENS = 6


def _token_text(value):
    """A special token from tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Text <-> token ids for one checkpoint.

    Tokenizer(path_to_tokenizer_json, config=None): ``config`` is the parsed
    tokenizer_config.json (chat template and special tokens), or None.
    Attributes: ``chat_template`` (str or None), ``eos_token``, ``bos_token`` (str or
    None), ``vocab_size`` (int, added tokens included).
    Raises FileNotFoundError for a missing file, ValueError for one that does not parse.
    """

    def __init__(self, path, config=None):
        if not os.path.isfile(path):
            raise FileNotFoundError(f"no tokenizer file at {path}")
        from tokenizers import Tokenizer as _HFTokenizer
        try:
            self._tok = _HFTokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception for bad JSON
            raise ValueError(f"cannot read tokenizer {path}: {e}") from None
        self._configure(config)

    @classmethod
    def from_backend(cls, backend, config=None):
        """Wrap a ``tokenizers.Tokenizer`` object ``backend`` (e.g. one built from a GGUF
        file's metadata); ``config`` as for the constructor."""
        self = cls.__new__(cls)
        self._tok = backend
        self._configure(config)
        return self

    def _configure(self, config):
        config = config or {}
        template = config.get("chat_template")
        if isinstance(template, list):     # [{"name": "default", "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        self.chat_template = template if isinstance(template, str) else None
        self.eos_token = _token_text(config.get("eos_token"))
        self.bos_token = _token_text(config.get("bos_token"))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def backend(self):
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text, add_special_tokens=True):
        """Token ids (list of int) of ``text`` (str); TypeError for a non-string."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens=True):
        """The text of token ids ``ids`` (iterable of int)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token):
        """The id of token string ``token``, or None."""
        return self._tok.token_to_id(token)

    def detokenizer(self, prompt_ids=()):
        """An :class:`IncrementalDetokenizer` for tokens generated after ``prompt_ids``."""
        return IncrementalDetokenizer(self, prompt_ids)


def load_tokenizer(model_dir):
    """The :class:`Tokenizer` of a checkpoint directory, or None if it has no
    ``tokenizer.json``. ValueError if tokenizer.json or tokenizer_config.json is corrupt."""
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    config = None
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        config = read_json_object(cfg_path)
    return Tokenizer(path, config)


class IncrementalDetokenizer:
    """Turns generated token ids into text one token at a time.

    ``step(token_id) -> str`` returns the new text (possibly empty: a token that ends
    in the middle of a UTF-8 character is held until the character is complete);
    ``flush() -> str`` returns what is still held (as the decoder renders it, e.g. U+FFFD
    for a broken character) when the completion ends. Special tokens are skipped. The
    pieces concatenate to the decoder's output for the generated tokens in the context of
    the prompt. Uses ``tokenizers``' ``DecodeStream`` where available, else the
    prefix/read-offset scheme vLLM uses.
    """

    __slots__ = ("_tok", "_stream", "_context", "_ids", "_prefix", "_read", "_emitted")

    def __init__(self, tokenizer, prompt_ids=()):
        self._tok = tokenizer.backend
        self._context = [int(i) for i in list(prompt_ids)[-_CONTEXT_TOKENS:]]
        try:
            from tokenizers.decoders import DecodeStream
            self._stream = DecodeStream(self._context, True)
        except (ImportError, TypeError):  # tokenizers < 0.21 (or no ids argument)
            self._stream = None
        self._ids = list(self._context)
        self._prefix = 0
        self._read = len(self._context)
        self._emitted = 0

    def step(self, token_id):
        """Append one generated token id; returns the text it completes (str)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        if self._stream is not None:
            piece = self._stream.step(self._tok, token_id) or ""
        else:
            ids = self._ids
            dec = self._tok.decode
            prefix = dec(ids[self._prefix:self._read], skip_special_tokens=True)
            full = dec(ids[self._prefix:], skip_special_tokens=True)
            piece = ""
            if len(full) > len(prefix) and not full.endswith("\ufffd"):
                self._prefix = self._read
                self._read = len(ids)
                piece = full[len(prefix):]
        self._emitted += len(piece)
        return piece

    def flush(self):
        """The text still held back at the end of the completion ("" if none)."""
        dec = self._tok.decode
        n = len(self._context)
        text = dec(self._ids, skip_special_tokens=True)[len(dec(self._ids[:n],
                                                              skip_special_tokens=True)):]
        rest = text[self._emitted:]
        self._emitted += len(rest)
        return rest
