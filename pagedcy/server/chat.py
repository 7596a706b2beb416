"""``POST /v1/chat/completions``: messages rendered through the checkpoint's chat template."""
from __future__ import annotations

import time
from typing import Optional

from pagedcy.server.chat_template import ChatTemplate, TemplateError
from pagedcy.server.errors import bad_request
from pagedcy.server.protocol import (ChatCompletionChoice, ChatCompletionChunk,
                                     ChatCompletionRequest, ChatCompletionResponse, ChatLogProbs,
                                     ChatResponseMessage, ChatStreamChoice, ChatTokenLogprob,
                                     ChatTopLogprob, DeltaMessage, UsageInfo, random_id)
from pagedcy.server.serving import MAX_LOGPROBS, RequestRunner, json_logprob, sse
from pagedcy.server.tracker import RequestTracker


def message_dicts(req: ChatCompletionRequest) -> list[dict]:
    """Messages as the template sees them: text parts of a list content joined by newlines."""
    out = []
    for i, m in enumerate(req.messages):
        d = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            texts = []
            for part in m.content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad_request(f"messages[{i}]: only text content parts are supported",
                                      param=f"messages.{i}.content")
                texts.append(part["text"])
            d["content"] = "\n".join(texts)
        out.append(d)
    return out


def chat_logprobs(runner: RequestRunner, token_ids, logprobs, top: int) -> ChatLogProbs:
    """Chat logprobs of ``token_ids`` (``logprobs``: one {token_id: logprob} per token)."""
    content = []
    for tid, lp in zip(token_ids, logprobs):
        ranked = sorted(lp.items(), key=lambda kv: -kv[1])[:top]
        content.append(ChatTokenLogprob(
            token=runner.decode_token(tid), logprob=json_logprob(lp.get(tid, float("-inf"))),
            bytes=list(runner.token_bytes(tid)),
            top_logprobs=[ChatTopLogprob(token=runner.decode_token(k), logprob=json_logprob(v),
                                         bytes=list(runner.token_bytes(k)))
                          for k, v in ranked]))
    return ChatLogProbs(content=content)


class ChatEndpoint:
    """Turns a ChatCompletionRequest into a response or an SSE stream."""

    def __init__(self, runner: RequestRunner, template: Optional[ChatTemplate]):
        self.runner = runner
        self.template = template

    def prompt_ids(self, req: ChatCompletionRequest) -> list[int]:
        """Token ids of the rendered conversation (special tokens come from the template)."""
        if self.template is None:
            raise bad_request("this model has no chat template (no 'chat_template' in its "
                              "tokenizer_config.json): use /v1/completions", param="messages",
                              code="no_chat_template")
        kwargs = dict(req.chat_template_kwargs or {})
        # as vLLM: the kwargs may set add_generation_prompt; the messages are the request's
        add_generation_prompt = kwargs.pop("add_generation_prompt", req.add_generation_prompt)
        if "messages" in kwargs:
            raise bad_request("chat_template_kwargs may not set 'messages'",
                              param="chat_template_kwargs")
        try:
            text = self.template.render(message_dicts(req),
                                        add_generation_prompt=add_generation_prompt, **kwargs)
        except TemplateError as exc:
            raise bad_request(str(exc), param="messages", code="chat_template_error") from exc
        return self.runner.encode(text, add_special_tokens=False)

    async def __call__(self, req: ChatCompletionRequest, raw_request):
        """The response: a ChatCompletionResponse, or an async iterator of SSE lines."""
        runner = self.runner
        runner.check_model(req.model)
        requested = req.requested_max_tokens()
        if requested is not None and requested <= 0:
            raise bad_request(f"max_tokens must be at least 1, got {requested}", param="max_tokens")
        top = req.top_logprobs if req.top_logprobs is not None else 0
        if not 0 <= top <= MAX_LOGPROBS or (top and not req.logprobs):
            raise bad_request(f"top_logprobs needs logprobs: true and must be in "
                              f"[0, {MAX_LOGPROBS}]", param="top_logprobs")
        arrival = time.perf_counter()
        prompt_ids = self.prompt_ids(req)
        max_tokens = runner.check_length(prompt_ids, requested)
        params = runner.sampling_params(req, max_tokens=max_tokens,
                                        logprobs=top if req.logprobs else None)
        request_id = random_id("chatcmpl")
        created = int(time.time())
        tracker = RequestTracker(req.n, len(prompt_ids), arrival)
        name = runner.model_name

        def lps(token_ids, logprobs):
            if not req.logprobs or not logprobs:
                return None
            return chat_logprobs(runner, token_ids, logprobs, top)

        if not req.stream:
            await runner.run(request_id, prompt_ids, params, tracker, raw_request)
            choices = [ChatCompletionChoice(
                index=i, message=ChatResponseMessage(content=tracker.texts[i]),
                logprobs=lps(tracker.token_ids[i], tracker.logprobs[i]),
                finish_reason=tracker.finish_reasons[i], stop_reason=tracker.stop_reasons[i])
                for i in range(req.n)]
            return ChatCompletionResponse(id=request_id, created=created, model=name,
                                          choices=choices, usage=UsageInfo(**tracker.usage()))

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        started = [False] * req.n

        def make_chunk(choices, usage=None):
            return ChatCompletionChunk(id=request_id, created=created, model=name,
                                       choices=choices, usage=usage)

        def chunk(choice):
            return sse(make_chunk([choice]))

        def render(deltas):
            events = []
            for d in deltas:
                if not started[d.index]:     # OpenAI opens each choice with the role
                    started[d.index] = True
                    events.append(chunk(ChatStreamChoice(
                        index=d.index, delta=DeltaMessage(role="assistant", content=""))))
                events.append(chunk(ChatStreamChoice(
                    index=d.index, delta=DeltaMessage(content=d.text),
                    logprobs=lps(d.token_ids, d.logprobs), finish_reason=d.finish_reason,
                    stop_reason=d.stop_reason)))
            return events

        return await runner.stream(request_id, prompt_ids, params, tracker, raw_request,
                                   render, make_chunk, include_usage)
