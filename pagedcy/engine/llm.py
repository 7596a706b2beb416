"""``LLM``: offline batch generation (vLLM's ``LLM.generate``)."""
import itertools
import sys

from pagedcy.engine.llm_engine import LLMEngine
from pagedcy.engine.sampling_params import SamplingParams

__all__ = ["LLM"]


def _is_single_prompt(prompts):
    if isinstance(prompts, (str, dict)):
        return True
    # a flat list of ints is one tokenized prompt, not a list of prompts
    return isinstance(prompts, (list, tuple)) and bool(prompts) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompts)


class LLM:
    """Generate completions for many prompts at once with continuous batching.

    LLM(model_dir, **kwargs): ``kwargs`` as :class:`LLMEngine` (kv_cache_pages,
    page_size, kv_dtype, max_num_seqs, max_num_batched_tokens, enable_prefix_cache,
    num_threads, seed, preemption_mode, swap_pages, max_model_len, dtype, quantization,
    activation_dtype, kv_store: a Redis URL of a KV page store shared by engines). ``llm_engine`` is the engine.
    """

    def __init__(self, model_dir, **kwargs):
        self.llm_engine = LLMEngine(model_dir, **kwargs)
        self._ids = itertools.count()

    def get_tokenizer(self):
        """The engine's :class:`~pagedcy.engine.tokenizer.Tokenizer` (None without one)."""
        return self.llm_engine.tokenizer

    def generate(self, prompts, sampling_params=None, use_tqdm=True):
        """Complete ``prompts`` (one prompt or a list: text, token-id lists or
        ``{"prompt_token_ids": [...]}``) and return one finished :class:`RequestOutput`
        each, in prompt order. ``sampling_params``: one :class:`SamplingParams` for all,
        a list with one per prompt, or None (the defaults). ``use_tqdm``: a progress bar
        on stderr when it is a terminal. Bad input raises before anything runs."""
        if _is_single_prompt(prompts):
            prompts = [prompts]
        else:
            try:
                prompts = list(prompts)
            except TypeError:
                raise TypeError(f"prompts must be a prompt or a list of prompts, got "
                                f"{type(prompts).__name__}") from None
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params = [sampling_params or SamplingParams()] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"{len(params)} sampling_params for {len(prompts)} prompts")
        engine = self.llm_engine
        order = {}
        try:
            for prompt, p in zip(prompts, params):
                rid = f"llm-{next(self._ids)}"
                engine.add_request(rid, prompt, p)
                order[rid] = len(order)
        except BaseException:
            engine.abort_request(list(order))
            raise
        results = [None] * len(order)
        bar = _progress_bar(len(order), use_tqdm)
        try:
            left = len(order)
            while left:
                for out in engine.step():
                    i = order.get(out.request_id)
                    if i is not None and out.finished:
                        results[i] = out
                        left -= 1
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            engine.abort_request(list(order))
            raise
        finally:
            if bar is not None:
                bar.close()
        return results


def _progress_bar(total, enabled):
    """A tqdm bar over finished requests, on stderr, only when it is a terminal."""
    if not enabled or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts", unit="req", dynamic_ncols=True)
