"""Run Hugging Face LLM checkpoints with continuous batching (vLLM's offline API).

- :class:`LLM`: ``generate(prompts, sampling_params)`` for a batch of prompts.
- :class:`LLMEngine`: ``add_request`` / ``step`` / ``abort_request``, one model forward
  per step over a flat batch of decode rows and prefill chunks.
- :class:`SamplingParams`, :class:`RequestOutput`, :class:`CompletionOutput`,
  :class:`EngineStats`.
"""
from pagedcy.engine.llm import LLM
from pagedcy.engine.llm_engine import LLMEngine
from pagedcy.engine.outputs import CompletionOutput, EngineStats, RequestOutput
from pagedcy.engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "SamplingParams", "RequestOutput", "CompletionOutput",
           "EngineStats"]
