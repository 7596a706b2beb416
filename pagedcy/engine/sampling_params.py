"""How to pick each generated token and when to stop (vLLM's ``SamplingParams``)."""
import dataclasses
import math
import numbers

from pagedcy import _validate

__all__ = ["SamplingParams"]

#: Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5


def _int(value, name, *, allow_none=False):
    if value is None and allow_none:
        return None
    return _validate.as_int(value, name)


def _require(name, value, ok, want):
    """``value`` if ``ok``, else ValueError saying ``name`` must be ``want``."""
    if not ok:
        raise ValueError(f"{name} must be {want}, got {value}")
    return value


def _float(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    v = float(value)
    if math.isnan(v):
        raise ValueError(f"{name} must not be NaN")
    return v


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling and stopping parameters of one request (vLLM names and defaults).

    n: completions per prompt (the prompt's pages are shared copy-on-write).
    max_tokens: tokens to generate at most (None: until the context is full).
    temperature: 0 (or below 1e-5) is greedy; otherwise logits are divided by it.
    top_p: nucleus mass in (0, 1]; top_k: keep the k best (0 or -1: off);
    min_p: drop tokens whose probability is below ``min_p`` times the best one's.
    seed: a per-request random stream, so the tokens do not depend on the batch.
    stop: strings that end the completion (the text is cut before them).
    stop_token_ids: token ids that end the completion.
    ignore_eos: keep generating past the model's EOS tokens.
    logprobs: None, or how many top tokens' log-probabilities (of the raw logits) to
    return per generated token besides the chosen one.

    Raises TypeError for wrong types, ValueError for out-of-range values.
    """

    n: int = 1
    max_tokens: "int | None" = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: "int | None" = None
    stop: "tuple[str, ...]" = ()
    stop_token_ids: "tuple[int, ...]" = ()
    ignore_eos: bool = False
    logprobs: "int | None" = None

    def __post_init__(self):
        def put(name, value):
            object.__setattr__(self, name, value)

        n = _int(self.n, "n")
        put("n", _require("n", n, n >= 1, "at least 1"))
        mt = _int(self.max_tokens, "max_tokens", allow_none=True)
        put("max_tokens", _require("max_tokens", mt, mt is None or mt >= 1, "at least 1"))
        t = _float(self.temperature, "temperature")
        put("temperature", _require("temperature", t, 0 <= t < math.inf, "finite and >= 0"))
        p = _float(self.top_p, "top_p")
        put("top_p", _require("top_p", p, 0.0 < p <= 1.0, "in (0, 1]"))
        k = _int(self.top_k, "top_k")
        _require("top_k", k, k >= -1, "-1 (off), 0 (off) or at least 1")
        put("top_k", 0 if k == -1 else k)
        mp = _float(self.min_p, "min_p")
        put("min_p", _require("min_p", mp, 0.0 <= mp <= 1.0, "in [0, 1]"))
        seed = _int(self.seed, "seed", allow_none=True)
        put("seed", _require("seed", seed, seed is None or seed >= 0, ">= 0"))
        stop = self.stop
        if stop is None:
            stop = ()
        elif isinstance(stop, str):
            stop = (stop,)
        else:
            try:
                stop = tuple(stop)
            except TypeError:
                raise TypeError(f"stop must be a string or a list of strings, got "
                                f"{type(self.stop).__name__}") from None
        for s in stop:
            if not isinstance(s, str):
                raise TypeError(f"stop strings must be str, got {type(s).__name__}")
            if not s:
                raise ValueError("stop strings must not be empty")
        put("stop", stop)
        ids = self.stop_token_ids
        if ids is None:
            ids = ()
        try:
            ids = tuple(_int(i, "stop_token_ids entry") for i in ids)
        except TypeError as e:
            if "entry" in str(e):
                raise
            raise TypeError("stop_token_ids must be a list of integers") from None
        if any(i < 0 for i in ids):
            raise ValueError("stop_token_ids must be >= 0")
        put("stop_token_ids", ids)
        if not isinstance(self.ignore_eos, (bool, int)) or isinstance(self.ignore_eos, float):
            raise TypeError("ignore_eos must be a bool")
        put("ignore_eos", bool(self.ignore_eos))
        lp = _int(self.logprobs, "logprobs", allow_none=True)
        put("logprobs", _require("logprobs", lp, lp is None or lp >= 0, "None or >= 0"))

    @property
    def greedy(self):
        """True when the most likely token is always taken (temperature ~ 0)."""
        return self.temperature < GREEDY_EPS
