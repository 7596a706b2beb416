"""Prompt parsing and validation: text, token ids or ``{"prompt_token_ids": [...]}``."""
import numpy as np

__all__ = ["parse_prompt"]


def _token_ids(ids, vocab_size):
    if isinstance(ids, (str, bytes)):
        raise TypeError("prompt_token_ids must be a list of integers, not a string")
    if isinstance(ids, (list, tuple)) and any(isinstance(t, bool) for t in ids):
        raise TypeError("prompt token ids must be integers, got a bool")
    try:
        arr = np.asarray(ids)
    except (ValueError, TypeError, OverflowError):
        raise TypeError("prompt token ids must be a flat list of integers") from None
    if arr.size == 0:
        raise ValueError("the prompt is empty (no token ids)")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"prompt token ids must be integers, got {arr.dtype} values")
    if arr.ndim != 1:
        raise TypeError(f"prompt token ids must be a flat list, got shape {arr.shape}")
    bad = np.nonzero((arr < 0) | (arr >= vocab_size))[0]
    if bad.size:
        i = int(bad[0])
        raise ValueError(f"prompt token id {int(arr[i])} at position {i} is outside the "
                         f"vocabulary [0, {vocab_size})")
    return arr.astype(np.int32)


def parse_prompt(prompt, tokenizer, vocab_size):
    """``(text or None, token ids int32 [n])`` of a prompt given as a string, a list of
    token ids (or an integer array), or a dict with ``"prompt_token_ids"`` (or
    ``"prompt"`` text). ValueError: empty prompt, an id outside ``[0, vocab_size)``, text
    without a tokenizer; TypeError: anything else."""
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), _token_ids(prompt["prompt_token_ids"], vocab_size)
        if "prompt" in prompt:
            prompt = prompt["prompt"]
            if not isinstance(prompt, str):
                raise TypeError("a prompt dict's 'prompt' must be a string")
        else:
            raise ValueError("a prompt dict needs 'prompt_token_ids' (or 'prompt' text)")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("the prompt is empty")
        if tokenizer is None:
            raise ValueError("the prompt is text but the model has no tokenizer.json: "
                             "pass token ids")
        ids = tokenizer.encode(prompt)
        if not ids:
            raise ValueError("the prompt encodes to no tokens")
        return prompt, _token_ids(ids, vocab_size)
    if isinstance(prompt, (list, tuple, np.ndarray)):
        return None, _token_ids(prompt, vocab_size)
    raise TypeError(f"prompt must be a str, a list of token ids or a dict with "
                    f"'prompt_token_ids', got {type(prompt).__name__}")
