"""``POST /v1/completions``: a text or token-id prompt, streamed or not."""
from __future__ import annotations

import time

from pagedcy.server.errors import bad_request
from pagedcy.server.protocol import (CompletionChoice, CompletionLogProbs, CompletionRequest,
                                     CompletionResponse, UsageInfo, random_id)
from pagedcy.server.serving import MAX_LOGPROBS, RequestRunner, json_logprob, sse
from pagedcy.server.tracker import RequestTracker


def completion_logprobs(runner: RequestRunner, token_ids, logprobs, offset: int,
                        top: int) -> CompletionLogProbs:
    """Legacy logprobs of ``token_ids`` (``logprobs``: one {token_id: logprob} per token);
    ``offset``: text offset of the first token."""
    out = CompletionLogProbs()
    for tid, lp in zip(token_ids, logprobs):
        out.tokens.append(runner.decode_token(tid))
        out.token_logprobs.append(json_logprob(lp[tid]) if tid in lp else None)
        ranked = sorted(lp.items(), key=lambda kv: -kv[1])[:top]
        out.top_logprobs.append({runner.decode_token(k): json_logprob(v) for k, v in ranked})
    out.text_offset = runner.text_offsets(token_ids, offset)
    return out


class CompletionsEndpoint:
    """Turns a CompletionRequest into a response or an SSE stream."""

    def __init__(self, runner: RequestRunner):
        self.runner = runner

    def _prompt_ids(self, req: CompletionRequest) -> list[int]:
        if isinstance(req.prompt, str):
            return self.runner.encode(req.prompt)
        return [int(t) for t in req.prompt]  # type: ignore[arg-type]  # one prompt (validator)

    async def __call__(self, req: CompletionRequest, raw_request):
        """The response: a CompletionResponse, or an async iterator of SSE lines."""
        runner = self.runner
        runner.check_model(req.model)
        if req.echo:
            raise bad_request("echo is not supported", param="echo")
        if req.logprobs is not None and not 0 <= req.logprobs <= MAX_LOGPROBS:
            raise bad_request(f"logprobs must be in [0, {MAX_LOGPROBS}], got {req.logprobs}",
                              param="logprobs")
        if req.max_tokens is not None and req.max_tokens <= 0:
            raise bad_request(f"max_tokens must be at least 1, got {req.max_tokens}",
                              param="max_tokens")
        arrival = time.perf_counter()
        prompt_ids = self._prompt_ids(req)
        max_tokens = runner.check_length(prompt_ids, req.max_tokens if req.max_tokens else 16)
        params = runner.sampling_params(req, max_tokens=max_tokens, logprobs=req.logprobs)
        request_id = random_id("cmpl")
        created = int(time.time())
        tracker = RequestTracker(req.n, len(prompt_ids), arrival)
        name = runner.model_name

        def choice_logprobs(i, token_ids, lps, offset):
            if req.logprobs is None or lps is None:
                return None
            return completion_logprobs(runner, token_ids, lps, offset, req.logprobs)

        if not req.stream:
            await runner.run(request_id, prompt_ids, params, tracker, raw_request)
            choices = [CompletionChoice(
                index=i, text=tracker.texts[i], finish_reason=tracker.finish_reasons[i],
                stop_reason=tracker.stop_reasons[i],
                logprobs=choice_logprobs(i, tracker.token_ids[i], tracker.logprobs[i] or None, 0))
                for i in range(req.n)]
            return CompletionResponse(id=request_id, created=created, model=name,
                                      choices=choices, usage=UsageInfo(**tracker.usage()))

        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        offsets = [0] * req.n

        def render(deltas):
            events = []
            for d in deltas:
                lp = choice_logprobs(d.index, d.token_ids, d.logprobs, offsets[d.index])
                offsets[d.index] += len(d.text)
                events.append(sse(make_chunk([CompletionChoice(
                    index=d.index, text=d.text, logprobs=lp, finish_reason=d.finish_reason,
                    stop_reason=d.stop_reason)])))
            return events

        def make_chunk(choices, usage=None):
            return CompletionResponse(id=request_id, created=created, model=name,
                                      choices=choices, usage=usage)

        return await runner.stream(request_id, prompt_ids, params, tracker, raw_request,
                                   render, make_chunk, include_usage)
