"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a status code.

Handlers turn every failure of a request (bad JSON, schema errors, values the engine refuses,
a full queue) into such a body, so the client sees the reason and the server keeps serving.
"""
from __future__ import annotations

import json
import logging
from typing import Optional

logger = logging.getLogger("pagedcy.server")

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          422: "invalid_request_error", 503: "service_unavailable_error", 500: "server_error"}


class APIError(Exception):
    """A request failure with its HTTP status and the OpenAI error fields."""

    def __init__(self, status: int, message: str, *, param: Optional[str] = None,
                 code: Optional[str] = None, type: Optional[str] = None):
        super().__init__(message)
        self.status = int(status)
        self.message = str(message)
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(self.status, "invalid_request_error")

    def body(self) -> dict:
        """The JSON body OpenAI sends for this error."""
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> APIError:
    """A 400 ``invalid_request_error``."""
    return APIError(400, message, param=param, code=code)


def error_response(err: APIError):
    """A JSON response carrying ``err``. ASCII-escaped, since a message may echo the
    client's text, and JSON lets a client send lone surrogates ("\\ud800") that UTF-8
    cannot encode (Starlette's JSONResponse would fail on them: a 500 for a 4xx)."""
    from starlette.responses import Response
    return Response(json.dumps(err.body()), status_code=err.status, media_type="application/json")


def sse_error(err: APIError) -> str:
    """``err`` as one server-sent event, for failures after a stream has started."""
    return f"data: {json.dumps(err.body())}\n\n"


def _validation_error(exc) -> APIError:
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return bad_request("request body is not valid JSON: "
                           + "; ".join(str(e.get("ctx", {}).get("error", e.get("msg"))) for e in errors),
                           code="invalid_json")
    if any(tuple(e.get("loc", ())) == ("body",)
           and e.get("type") in ("model_attributes_type", "dict_type", "missing") for e in errors):
        # the body as a whole is missing or is not an object
        return bad_request("request body must be a JSON object (sent as Content-Type: "
                           "application/json)", code="invalid_body")
    first = errors[0] if errors else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    param = ".".join(loc) or None
    details = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
        for e in errors)
    return APIError(422, f"invalid request: {details}", param=param, code="invalid_value")


def install_handlers(app) -> None:
    """Register the handlers that turn every exception into an OpenAI error body."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(APIError)
    async def _api_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc):
        return error_response(_validation_error(exc))

    @app.exception_handler(HTTPException)
    async def _http(request, exc):
        return error_response(APIError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(request, exc):
        logger.exception("unexpected error serving %s", request.url.path)
        return error_response(APIError(500, f"internal error: {type(exc).__name__}"))
