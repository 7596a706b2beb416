"""What an allocation asks for: :class:`AllocationRequest`."""
import numpy as np

from pagedcy import _validate

__all__ = ["AllocationRequest"]


class AllocationRequest:
    """What :meth:`PagedKVCacheManager.allocate` should reserve.

    request_id: any hashable id (None: the manager assigns ``"req-<n>"``).
    initial_tokens: tokens the new handle holds (``num_tokens()``); pages for them are
    allocated. With ``prompt_tokens`` it defaults to (and must be at least) the prompt length.
    max_sequence_length: upper bound for ``num_tokens()`` over the handle's life (None: no bound).
    prompt_tokens: 1-D integer token ids; enables prefix-cache lookup and registration.
    cache_salt: optional bytes/str mixed into the first page's hash so different tenants
    (or LoRA adapters) never share cached pages.

    Raises ValueError for negative counts or ``initial_tokens`` above ``max_sequence_length``,
    TypeError for non-integer counts/tokens.
    """

    __slots__ = ("request_id", "initial_tokens", "max_sequence_length", "prompt_tokens",
                 "cache_salt")

    def __init__(self, request_id=None, initial_tokens=0, max_sequence_length=None,
                 prompt_tokens=None, cache_salt=None):
        self.request_id = request_id
        init = _validate.check_count(initial_tokens, "initial_tokens")
        if prompt_tokens is not None:
            pt = _validate.token_id_array(prompt_tokens, "prompt_tokens")
            if pt.ndim != 1:
                raise TypeError("prompt_tokens must be a 1-D integer sequence")
            if pt.size and pt.min() < 0:
                raise ValueError("prompt_tokens must be non-negative")
            pt = pt.astype(np.int64)
            init = max(init, int(pt.shape[0]))
            prompt_tokens = pt
        self.initial_tokens = init
        if max_sequence_length is not None:
            max_sequence_length = _validate.check_count(max_sequence_length, "max_sequence_length")
            if init > max_sequence_length:
                raise ValueError(f"initial_tokens {init} exceeds max_sequence_length "
                                 f"{max_sequence_length}")
        self.max_sequence_length = max_sequence_length
        self.prompt_tokens = prompt_tokens
        if isinstance(cache_salt, str):
            cache_salt = cache_salt.encode()
        if cache_salt is not None and not isinstance(cache_salt, (bytes, bytearray)):
            raise TypeError("cache_salt must be bytes, str or None")
        self.cache_salt = bytes(cache_salt) if cache_salt is not None else None

    def __repr__(self):
        n = None if self.prompt_tokens is None else len(self.prompt_tokens)
        return (f"AllocationRequest(request_id={self.request_id!r}, initial_tokens="
                f"{self.initial_tokens}, max_sequence_length={self.max_sequence_length}, "
                f"prompt_tokens=<{n} tokens>)")
