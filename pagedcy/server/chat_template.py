"""Chat templates rendered as transformers renders them.

The template comes from the checkpoint's ``tokenizer_config.json`` (``chat_template``: a string,
or a list of ``{"name", "template"}`` from which "default" is taken) or a ``chat_template.jinja``
beside it. It is compiled in jinja2's ``ImmutableSandboxedEnvironment`` with transformers'
settings (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``), globals ``raise_exception`` and
``strftime_now``, and its ``tojson`` filter, and rendered with ``messages``,
``add_generation_prompt`` and the special tokens (``bos_token``, ``eos_token``, ...).
"""
from __future__ import annotations

import json
import os
from datetime import datetime
from typing import Any, Optional

from pagedcy._validate import read_json_object

_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
                 "mask_token")


class TemplateError(ValueError):
    """The template refused the messages (``raise_exception``) or failed to render."""


def _token_text(tok) -> Optional[str]:
    # tokenizer_config.json stores special tokens as strings or as AddedToken dicts
    if isinstance(tok, dict):
        return tok.get("content")
    return tok if isinstance(tok, str) else None


def _pick_template(value) -> Optional[str]:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default")
    return None


class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: Optional[dict[str, str]] = None):
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                              separators=separators, sort_keys=sort_keys)

        def strftime_now(fmt):
            return datetime.now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = strftime_now
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not compile: {exc}") from exc

    @classmethod
    def from_model_dir(cls, model_dir, tokenizer=None) -> Optional["ChatTemplate"]:
        """The template of the checkpoint in ``model_dir``, or None when it has none.

        ``tokenizer`` (the engine's, optional) supplies the template and the bos/eos tokens
        when the config files do not.
        """
        config: dict[str, Any] = {}
        path = os.path.join(os.fspath(model_dir), "tokenizer_config.json")
        if os.path.isfile(path):
            config = read_json_object(path)
        source = _pick_template(config.get("chat_template"))
        jinja_path = os.path.join(os.fspath(model_dir), "chat_template.jinja")
        if source is None and os.path.isfile(jinja_path):
            with open(jinja_path, encoding="utf-8") as f:
                source = f.read()
        if source is None and tokenizer is not None:
            source = _pick_template(getattr(tokenizer, "chat_template", None))
        if source is None:
            return None
        special = {k: _token_text(config.get(k)) for k in _SPECIAL_KEYS}
        for k in ("bos_token", "eos_token"):
            if special.get(k) is None and tokenizer is not None:
                special[k] = _token_text(getattr(tokenizer, k, None))
        return cls(source, {k: v for k, v in special.items() if v is not None})

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True,
               **kwargs) -> str:
        """The prompt text for ``messages`` (dicts with "role" and "content").

        Raises TemplateError with the template's own message when it refuses the input.
        """
        import jinja2
        # tools/documents are passed as None, as transformers does: templates test `is none`
        context = {"tools": None, "documents": None, **self.special_tokens, **kwargs}
        try:
            return self._template.render(messages=messages,
                                         add_generation_prompt=add_generation_prompt, **context)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TemplateError(f"the chat template failed on these messages: {exc}") from exc
