"""OpenAI request and response bodies (pydantic), with vLLM's extra sampling fields.

Requests accept what the official ``openai`` client sends; unknown fields are ignored, as
OpenAI and vLLM do. Responses serialise to the shapes the client parses.
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator


def random_id(prefix: str) -> str:
    """A fresh id such as ``cmpl-3f2a...``: request ids must never collide in the engine."""
    return f"{prefix}-{uuid.uuid4().hex}"


# --- requests -----------------------------------------------------------------------------

class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the usage counts."""
    include_usage: Optional[bool] = False


class _SamplingFields(BaseModel):
    """Fields common to both endpoints that map onto ``SamplingParams``."""
    model_config = ConfigDict(extra="ignore")

    model: Optional[str] = None
    n: StrictInt = 1
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    seed: Optional[StrictInt] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    user: Optional[str] = None
    # vLLM's extra sampling fields
    top_k: Optional[StrictInt] = None
    min_p: Optional[float] = None
    ignore_eos: bool = False
    stop_token_ids: Optional[list[StrictInt]] = None

    def stop_list(self) -> Optional[list[str]]:
        """``stop`` as a list (OpenAI takes a string or a list)."""
        if self.stop is None:
            return None
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_SamplingFields):
    """``POST /v1/completions``: prompt as text or token ids (one prompt per request)."""
    prompt: Union[str, list[StrictInt], list[str], list[list[StrictInt]]]
    max_tokens: Optional[StrictInt] = 16
    logprobs: Optional[StrictInt] = None
    echo: bool = False

    @model_validator(mode="after")
    def _one_prompt(self):
        # The client wraps a single prompt in a list sometimes; more than one is not supported.
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise ValueError("only one prompt per request is supported")
            self.prompt = p[0]
        return self


class ChatMessage(BaseModel):
    """One chat message; ``content`` is text or a list of ``{"type": "text", "text": ...}``."""
    model_config = ConfigDict(extra="allow")

    role: str
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None


class ChatCompletionRequest(_SamplingFields):
    """``POST /v1/chat/completions``."""
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Optional[StrictInt] = None
    max_completion_tokens: Optional[StrictInt] = None
    logprobs: bool = False
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: bool = True
    chat_template_kwargs: Optional[dict[str, Any]] = None

    def requested_max_tokens(self) -> Optional[int]:
        """``max_completion_tokens`` (the new name) wins over ``max_tokens``."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens


# --- responses ----------------------------------------------------------------------------

class UsageInfo(BaseModel):
    """Token counts of a request: prompt, completion (all choices), total."""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class CompletionLogProbs(BaseModel):
    """Legacy completions logprobs: one entry per generated token."""
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """One completion of /v1/completions (or its delta in a stream chunk)."""
    index: int
    text: str
    logprobs: Optional[CompletionLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class CompletionResponse(BaseModel):
    """/v1/completions response, and each chunk of its stream."""
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Optional[UsageInfo] = None


class ChatTopLogprob(BaseModel):
    """One candidate token and its logprob."""
    token: str
    logprob: float
    bytes: Optional[list[int]] = None


class ChatTokenLogprob(ChatTopLogprob):
    """A generated token's logprob and its top candidates."""
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogProbs(BaseModel):
    """Chat logprobs: one entry per generated token."""
    content: Optional[list[ChatTokenLogprob]] = None


class ChatResponseMessage(BaseModel):
    """The assistant message of a chat choice."""
    role: str = "assistant"
    content: Optional[str] = None


class ChatCompletionChoice(BaseModel):
    """One choice of /v1/chat/completions."""
    index: int
    message: ChatResponseMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionResponse(BaseModel):
    """/v1/chat/completions response."""
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: Optional[UsageInfo] = None


class DeltaMessage(BaseModel):
    """What a stream chunk adds to a chat choice's message."""
    role: Optional[str] = None
    content: Optional[str] = None


class ChatStreamChoice(BaseModel):
    """One choice's delta in a chat stream chunk."""
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChatLogProbs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[Union[int, str]] = None


class ChatCompletionChunk(BaseModel):
    """One chunk of a /v1/chat/completions stream."""
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: Optional[UsageInfo] = None


class ModelCard(BaseModel):
    """One served model in /v1/models."""
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "pagedcy"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ModelList(BaseModel):
    """/v1/models response."""
    object: Literal["list"] = "list"
    data: list[ModelCard]
