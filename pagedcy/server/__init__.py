"""OpenAI-compatible HTTP server over :class:`pagedcy.engine.LLMEngine`.

``python -m pagedcy serve --model DIR`` (see :mod:`pagedcy.server.launch`). Modules:
``protocol`` (request/response bodies), ``async_engine`` (the engine thread and its asyncio
bridge), ``serving``/``completions``/``chat`` (the endpoints), ``tracker`` (deltas, usage,
timing), ``chat_template``, ``metrics``, ``auth``, ``errors``, ``app`` (routes). With
``--replicas N`` (Ray Serve): ``replicas`` (the deployments), ``remote_engine`` (the front end's
engine over a Serve handle), ``router`` (Serve request routers), ``routing`` (the prefix-aware
rules, without Ray). Nothing here is imported by ``import pagedcy``.
"""
