"""A checkpoint's tokenizer (``tokenizer.json`` through the ``tokenizers`` library) and
incremental detokenization of generated tokens.

``tokenizers`` is imported only when a tokenizer is loaded, so ``import pagedcy`` stays
NumPy-only.
"""
import json
import os
import re

from pagedcy._validate import read_json_object

__all__ = ["Tokenizer", "IncrementalDetokenizer", "load_tokenizer"]

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
        self._byte_ids = None
        self._special_ids = None
        self._token_bytes = None

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

    def detokenizer(self):
        """A new :class:`IncrementalDetokenizer` (one per completion)."""
        return IncrementalDetokenizer(self)

    def byte_fallback_ids(self):
        """The ids of SentencePiece byte-fallback tokens (``<0x00>`` .. ``<0xFF>``) when the
        decoder renders them as bytes, else an empty frozenset."""
        if self._byte_ids is None:
            if "ByteFallback" in _decoder_types(self._tok):
                self._byte_ids = frozenset(i for t, i in self._tok.get_vocab().items()
                                           if _BYTE_TOKEN.fullmatch(t))
            else:
                self._byte_ids = frozenset()
        return self._byte_ids

    def special_ids(self):
        """The ids of special tokens (frozenset): ``decode`` skips them."""
        if self._special_ids is None:
            self._special_ids = frozenset(
                i for i, t in self._tok.get_added_tokens_decoder().items() if t.special)
        return self._special_ids

    def token_bytes_table(self):
        """``{id: (bytes, is_byte_fallback)}``: the bytes each token adds to the text in the
        middle of a completion (before any UTF-8 decoding), built once from the decoder."""
        if self._token_bytes is None:
            self._token_bytes = token_bytes_table(self._tok)
        return self._token_bytes

    def token_bytes(self, token_id):
        """The bytes token ``token_id`` (int) adds to the text: a byte-level BPE token
        may hold part of a UTF-8 character, so its own ``decode`` is not its bytes."""
        got = self.token_bytes_table().get(int(token_id))
        return got[0] if got is not None else self.decode([token_id]).encode()

    def token_text(self, token_id):
        """One token as a string, for logprobs: its bytes as UTF-8, or OpenAI's
        ``"bytes:\\xe4\\xb8"`` form when they are not whole characters."""
        raw = self.token_bytes(token_id)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _decoder_chain(backend):
    """The decoder's steps as JSON dicts (a ``Sequence`` unrolled)."""
    spec = json.loads(backend.to_str()).get("decoder") or {}
    return (spec.get("decoders") or []) if spec.get("type") == "Sequence" else [spec]


def _decoder_types(backend):
    return {d.get("type") for d in _decoder_chain(backend)}


def byte_level_alphabet():
    """``{printable character: byte}``: GPT-2's alphabet that ByteLevel tokenizers store
    tokens in (``tokenizers`` does not export it)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes_table(backend):
    """``{id: (bytes, is_byte_fallback)}`` for every token of a ``tokenizers.Tokenizer``:
    the bytes the decoder turns it into in the middle of a text (ByteLevel's alphabet
    undone, ``<0xNN>`` byte-fallback tokens as their byte, SentencePiece's ``▁`` as a
    space); special tokens add nothing; added tokens are their own text."""
    chain = _decoder_chain(backend)
    types = {d.get("type") for d in chain}
    alphabet = byte_level_alphabet() if "ByteLevel" in types else None
    fallback = "ByteFallback" in types
    replace = [(d["pattern"]["String"], d.get("content", "")) for d in chain
               if d.get("type") == "Replace" and isinstance(d.get("pattern"), dict)
               and isinstance(d["pattern"].get("String"), str)]
    replace += [(d.get("replacement", "\u2581"), " ") for d in chain if d.get("type") == "Metaspace"]
    added = backend.get_added_tokens_decoder()
    table = {}
    for tok, i in backend.get_vocab(with_added_tokens=True).items():
        if i in added:
            table[i] = (b"" if added[i].special else added[i].content.encode(), False)
        elif fallback and _BYTE_TOKEN.fullmatch(tok):
            table[i] = (bytes([int(tok[3:5], 16)]), True)
        elif alphabet is not None and all(c in alphabet for c in tok):
            table[i] = (bytes(alphabet[c] for c in tok), False)
        else:
            for old, new in replace:
                tok = tok.replace(old, new)
            table[i] = (tok.encode(), False)
    return table


def load_tokenizer(model_dir):
    """The :class:`Tokenizer` of a checkpoint directory (or of a GGUF file, built from its
    metadata), or None if it has no ``tokenizer.json``. ValueError if tokenizer.json or
    tokenizer_config.json is corrupt."""
    from pagedcy.models.loader import is_gguf
    if is_gguf(model_dir):
        from pagedcy.models.gguf_model import read_gguf
        with read_gguf(model_dir) as f:
            return f.tokenizer()
    path = os.path.join(model_dir, "tokenizer.json")
    if not os.path.isfile(path):
        return None
    config = None
    cfg_path = os.path.join(model_dir, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        config = read_json_object(cfg_path)
    return Tokenizer(path, config)


class IncrementalDetokenizer:
    """Turns a completion's token ids into text one token at a time.

    ``step(token_id) -> str`` returns the text the token completes (possibly ""), and
    ``flush() -> str`` what is still held when the completion ends, so that the pieces
    concatenate to exactly ``tokenizer.decode(ids, skip_special_tokens=True)`` of the ids
    given. Only the completion's own tokens are decoded: no prompt text can leak into it.

    vLLM's scheme, over the completion's ids: each step decodes the window
    ``ids[prefix:]`` and emits what it adds to the text of ``ids[prefix:read]``, then moves
    ``prefix`` to ``read`` and ``read`` to the end. Decoding from ``prefix`` rather than
    ``read`` keeps what a decoder does to a window's first token (SentencePiece's stripped
    leading space) on both sides of the difference. A window is held, and nothing is
    emitted, while its text ends in U+FFFD (a character whose bytes are still arriving) or
    its last token is a byte-fallback token (``<0xE4>``: the decoder renders a run of them
    as a whole, so a run must not be split) or a special token (skipped, so a run goes on
    past it). ``flush`` emits the held rest as the decoder
    renders it (U+FFFD for a character cut short).
    """

    __slots__ = ("_decode", "_bytes", "_ids", "_prefix", "_read", "_prefix_text")

    def __init__(self, tokenizer):
        backend = tokenizer.backend
        self._decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        self._bytes = tokenizer.byte_fallback_ids() | tokenizer.special_ids()
        self._ids = []
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""

    def step(self, token_id):
        """Append one generated token id (int); returns the text it completes (str)."""
        token_id = int(token_id)
        self._ids.append(token_id)
        if token_id in self._bytes:    # a byte-fallback run may go on past a skipped token
            return ""
        text = self._decode(self._ids[self._prefix:])
        if (len(text) <= len(self._prefix_text) or text.endswith("\ufffd")
                or not text.startswith(self._prefix_text)):
            return ""
        return self._advance(text)

    def _advance(self, text):
        piece = text[len(self._prefix_text):]
        self._prefix, self._read = self._read, len(self._ids)
        self._prefix_text = self._decode(self._ids[self._prefix:self._read])
        return piece

    def flush(self):
        """The text still held at the end of the completion ("" if none)."""
        if self._read == len(self._ids):
            return ""
        text = self._decode(self._ids[self._prefix:])
        if not text.startswith(self._prefix_text):   # a decoder that rewrites its past:
            self._read = len(self._ids)               # nothing right to emit
            return ""
        return self._advance(text)
