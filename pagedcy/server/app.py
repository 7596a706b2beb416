"""The FastAPI app: routes over one :class:`AsyncEngine`.

``GET /health``, ``GET /metrics``, ``GET /v1/models``, ``POST /v1/completions``,
``POST /v1/chat/completions``. With an API key, every ``/v1`` route needs
``Authorization: Bearer <key>``; ``/health`` and ``/metrics`` stay open.
"""
import contextlib
from typing import Optional

from fastapi import FastAPI, Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from pagedcy.server.async_engine import AsyncEngine
from pagedcy.server.chat import ChatEndpoint
from pagedcy.server.chat_template import ChatTemplate
from pagedcy.server.completions import CompletionsEndpoint
from pagedcy.server.errors import APIError, install_handlers, logger
from pagedcy.server.metrics import ServerMetrics
from pagedcy.server.protocol import (ChatCompletionRequest, CompletionRequest, ModelCard,
                                     ModelList)
from pagedcy.server.serving import ClientGone, RequestRunner


def build_app(engine: AsyncEngine, *, model_names: list[str],
              chat_template: Optional[ChatTemplate] = None, api_key: Optional[str] = None):
    """A FastAPI app serving ``engine`` (started and stopped with the app's lifespan)."""
    metrics = ServerMetrics(lambda: engine.stats, model_names[0])
    runner = RequestRunner(engine, model_names, metrics)
    completions = CompletionsEndpoint(runner)
    chat = ChatEndpoint(runner, chat_template)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        if not engine.is_alive():
            engine.start()
        yield
        engine.shutdown()

    app = FastAPI(title="pagedcy", lifespan=lifespan, docs_url=None, redoc_url=None)
    install_handlers(app)
    if api_key:
        from pagedcy.server.auth import APIKeyMiddleware
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
    app.state.engine = engine
    app.state.metrics = metrics

    async def respond(endpoint, req, raw: Request):
        try:
            result = await endpoint(req, raw)
        except APIError as err:
            metrics.observe_error(err.status)
            raise
        except ClientGone:
            return Response(status_code=499)    # nobody reads it; the request was aborted
        if hasattr(result, "__aiter__"):
            return _SSEResponse(result, media_type="text/event-stream",
                                headers={"Cache-Control": "no-cache"})
        return JSONResponse(result.model_dump())

    class _SSEResponse(StreamingResponse):
        """Closes its event iterator however the response ends, so a request whose client
        left is aborted at once rather than when the generator is collected."""

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                await self.body_iterator.aclose()

    @app.get("/health")
    async def health():
        if not engine.is_alive():
            return JSONResponse(APIError(503, "the engine is not running").body(), status_code=503)
        return Response(status_code=200)

    @app.get("/metrics")
    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=n, root=str(engine.engine.model_dir),
                                         max_model_len=engine.engine.max_model_len)
                               for n in model_names]).model_dump()

    @app.post("/v1/completions")
    async def create_completion(req: CompletionRequest, raw: Request):
        return await respond(completions, req, raw)

    @app.post("/v1/chat/completions")
    async def create_chat_completion(req: ChatCompletionRequest, raw: Request):
        return await respond(chat, req, raw)

    logger.debug("app built for %s", model_names[0])
    return app
