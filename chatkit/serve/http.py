"""The HTTP plumbing every endpoint shares: the body reader (size and depth limits) and the
key check with errors in the endpoint's shape (OpenAI's, or Anthropic's)."""

from __future__ import annotations

import hmac
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..errors import RequestError
from . import anthropic_api
from .openai_api import MAX_BODY_DEPTH, bad, check_body, translate_error

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")


def guarded(handler: Callable[[Request], Any], api_key: str | None, *,
            anthropic: bool = False) -> Callable[[Request], Any]:
    """``handler`` behind the API key check (when ``api_key`` is set: ``Authorization:
    Bearer KEY`` or ``x-api-key: KEY``), its errors answered in OpenAI's error shape, or
    Anthropic's for ``anthropic``."""
    from starlette.responses import JSONResponse

    async def guard(request: Request) -> Response:
        try:
            if api_key is not None:
                given = request.headers.get("authorization", "")
                token = given[7:] if given.lower().startswith("bearer ") else \
                    request.headers.get("x-api-key", "")
                if not hmac.compare_digest(token.encode(), api_key.encode()):
                    raise RequestError(401, "invalid or missing API key",
                                       type="authentication_error", code="invalid_api_key")
            response: Response = await handler(request)
            return response
        except Exception as exc:
            err = translate_error(exc)
            if err.status >= 500:
                _log.error("%s %s: %s", request.method, request.url.path, err.message,
                           exc_info=not isinstance(exc, RequestError))
            body = anthropic_api.error_body(err) if anthropic else err.body()
            return JSONResponse(body, status_code=err.status, headers=err.headers)

    return guard


async def read_body(request: Request, limit: int) -> Any:
    """The request's JSON body: at most ``limit`` bytes (413), JSON nesting within
    ``MAX_BODY_DEPTH`` (400)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body exceeds {limit} bytes", code="body_too_large")
    data = bytearray()
    async for part in request.stream():
        data += part
        if len(data) > limit:
            raise RequestError(413, f"the body exceeds {limit} bytes",
                               code="body_too_large")
    try:
        body = json.loads(data)
    except RecursionError:
        raise bad(f"the body nests deeper than {MAX_BODY_DEPTH} levels",
                  code="body_too_deep") from None
    except ValueError as exc:
        raise bad(f"the body is not JSON: {exc}") from exc
    check_body(body)
    return body


def wants_anthropic(request: Request) -> bool:
    """Whether the client speaks Anthropic's API (its path or its headers say so)."""
    return request.url.path.startswith("/v1/messages") or bool(
        {"anthropic-version", "x-api-key"} & set(request.headers))


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (404 for an unknown path, 405 for a wrong method) in the
    client's API's error shape instead of plain text."""
    from starlette.exceptions import HTTPException
    from starlette.responses import JSONResponse

    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = (f"no such endpoint: {request.method} {request.url.path}" if status == 404 else
               f"{request.method} is not allowed on {request.url.path}" if status == 405 else
               str(getattr(exc, "detail", "")) or "error")
    err = RequestError(status, message, code="not_found" if status == 404 else None)
    body = anthropic_api.error_body(err) if wants_anthropic(request) else err.body()
    return JSONResponse(body, status_code=status,
                        headers=getattr(exc, "headers", None) or None)

