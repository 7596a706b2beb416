"""How to pick each generated token and when to stop (vLLM's ``SamplingParams``)."""
import dataclasses
import math
import numbers
import operator

__all__ = ["SamplingParams"]

#: Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``).
GREEDY_EPS = 1e-5


def _int(value, name, *, allow_none=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None


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
        if n < 1:
            raise ValueError(f"n must be at least 1, got {n}")
        put("n", n)
        mt = _int(self.max_tokens, "max_tokens", allow_none=True)
        if mt is not None and mt < 1:
            raise ValueError(f"max_tokens must be at least 1, got {mt}")
        put("max_tokens", mt)
        t = _float(self.temperature, "temperature")
        if t < 0 or math.isinf(t):
            raise ValueError(f"temperature must be a finite number >= 0, got {t}")
        put("temperature", t)
        p = _float(self.top_p, "top_p")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {p}")
        put("top_p", p)
        k = _int(self.top_k, "top_k")
        if k < -1:
            raise ValueError(f"top_k must be -1 (off), 0 (off) or at least 1, got {k}")
        put("top_k", 0 if k == -1 else k)
        mp = _float(self.min_p, "min_p")
        if not 0.0 <= mp <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {mp}")
        put("min_p", mp)
        seed = _int(self.seed, "seed", allow_none=True)
        if seed is not None and seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        put("seed", seed)
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
        if lp is not None and lp < 0:
            raise ValueError(f"logprobs must be None or >= 0, got {lp}")
        put("logprobs", lp)

    @property
    def greedy(self):
        """True when the most likely token is always taken (temperature ~ 0)."""
        return self.temperature < GREEDY_EPS
