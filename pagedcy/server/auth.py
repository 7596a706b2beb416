"""API-key check for ``/v1`` routes, as vLLM's ``--api-key`` does.

A pure ASGI middleware (no ``BaseHTTPMiddleware``: it would buffer streams and hide client
disconnects). The key is compared with ``hmac.compare_digest`` and never logged.
"""
from __future__ import annotations

import hmac
import os
from typing import Optional

from pagedcy.server.errors import APIError

API_KEY_ENV = "PAGEDCY_API_KEY"


def resolve_api_key(cli_key: Optional[str]) -> Optional[str]:
    """``--api-key`` if given, else ``$PAGEDCY_API_KEY``, else None (no check)."""
    key = cli_key if cli_key else os.environ.get(API_KEY_ENV)
    return key or None


class APIKeyMiddleware:
    """Answers 401 to every ``/v1`` request without ``Authorization: Bearer <key>``."""

    def __init__(self, app, api_key: str):
        self.app = app
        self._key = api_key.encode("utf-8")

    def _authorized(self, scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                if scheme.lower() == b"bearer":
                    return hmac.compare_digest(token.strip(), self._key)
                return False
        return False

    async def __call__(self, scope, receive, send):
        if (scope["type"] == "http" and scope.get("method") != "OPTIONS"
                and scope["path"].startswith("/v1") and not self._authorized(scope)):
            from pagedcy.server.errors import error_response
            err = APIError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
            await error_response(err)(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def __repr__(self) -> str:               # never show the key
        return "APIKeyMiddleware(<key hidden>)"
