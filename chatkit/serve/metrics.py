"""``GET /metrics``: Prometheus' text format, with prometheus-client (the ``metrics`` extra).

Names follow vLLM's (``vllm:`` there, ``chatkit:`` here) where they mean the same, so its
dashboards carry over:

==========================================  =========  ==========================================
``chatkit:requests_total``                  counter    HTTP requests by ``route`` and ``status``
``chatkit:request_success_total``           counter    replies by ``finished_reason``
``chatkit:prompt_tokens_total``             counter    prompt tokens of finished replies
``chatkit:prefix_cache_hits_total``         counter    ... of them served from the KV cache
``chatkit:generation_tokens_total``         counter    reply tokens
``chatkit:time_to_first_token_seconds``     histogram  from the request's start to its first token
``chatkit:time_per_output_token_seconds``   histogram  between tokens after the first
``chatkit:e2e_request_latency_seconds``     histogram  from the request's start to its reply
``chatkit:num_requests_running``            gauge      turns holding a KV sequence
``chatkit:num_requests_waiting``            gauge      turns queued for one
``chatkit:kv_cache_used_cells``             gauge      KV cells the sequences hold
``chatkit:kv_cache_usage_perc``             gauge      ... as a share of the context (0-1)
``chatkit:grammar_compiles_total``          counter    grammars compiled (cache misses)
``chatkit:grammar_compile_seconds_total``   counter    time spent compiling them
``chatkit:rollbacks_total``                 counter    value checks that took tokens back
==========================================  =========  ==========================================

Label values are bounded: ``route`` is one of the server's routes (``other`` for any
unknown path), ``status`` an HTTP status, ``finished_reason`` one of OpenAI's. Each server
has its own registry (several in one process do not mix).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..chat.plan import COMPILES
from ..errors import RequestError
from .openai_api import finish_reason

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ..chat.scheduler import EngineLoop
    from ..engine.protocols import Forward, StepEngine
    from .lanes import Lane

__all__: list[str] = []

_log = logging.getLogger("chatkit.server")

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                   160.0, 320.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


def available() -> bool:
    """Whether prometheus-client is installed (``pip install 'chatkit[metrics]'``)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


class Metrics:
    """The server's metrics: the ASGI middleware that counts requests (:meth:`wrap`), the
    lanes' finish hook (:meth:`finished`), and the scrape (:meth:`endpoint`)."""

    def __init__(self, model: StepEngine, loop: EngineLoop) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = r = CollectorRegistry()
        self.requests = Counter("chatkit:requests", "HTTP requests by route and status",
                                ["route", "status"], registry=r)
        self.success = Counter("chatkit:request_success", "Replies by finish reason",
                               ["finished_reason"], registry=r)
        self.prompt = Counter("chatkit:prompt_tokens", "Prompt tokens of finished replies",
                              registry=r)
        self.cached = Counter("chatkit:prefix_cache_hits",
                              "Prompt tokens served from the KV cache", registry=r)
        self.generation = Counter("chatkit:generation_tokens", "Reply tokens", registry=r)
        self.rollbacks = Counter("chatkit:rollbacks", "Value checks that took tokens back",
                                 registry=r)
        self.ttft = Histogram("chatkit:time_to_first_token_seconds", "Time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("chatkit:time_per_output_token_seconds",
                              "Time per output token after the first",
                              buckets=TOKEN_BUCKETS, registry=r)
        self.e2e = Histogram("chatkit:e2e_request_latency_seconds", "Request latency",
                             buckets=LATENCY_BUCKETS, registry=r)
        Gauge("chatkit:num_requests_running", "Turns holding a KV sequence",
              registry=r).set_function(lambda: loop.running)
        Gauge("chatkit:num_requests_waiting", "Turns queued for a KV sequence",
              registry=r).set_function(lambda: loop.queued)
        cells = _cells_used(model)
        size = max(1, int(getattr(model, "n_ctx", model.n_ctx_seq)))
        Gauge("chatkit:kv_cache_used_cells", "KV cells the sequences hold",
              registry=r).set_function(cells)
        Gauge("chatkit:kv_cache_usage_perc", "KV cells held, as a share of the context",
              registry=r).set_function(lambda: cells() / size)
        r.register(_Compiles())

    def finished(self, lane: Lane, started: float, first: float | None) -> None:
        """A lane ended with its reply (``started``/``first``: monotonic times of the
        request's start and of the lane's first text)."""
        reply = lane.reply
        if reply is None:
            return
        u = reply.usage
        end = time.monotonic()
        self.success.labels(finished_reason=finish_reason(reply.finish_reason)).inc()
        self.prompt.inc(u.prompt_tokens)
        self.cached.inc(u.cached_prompt_tokens)
        self.generation.inc(u.completion_tokens)
        self.rollbacks.inc(u.rollbacks)
        self.e2e.observe(end - started)
        # the first token: the first text seen, else (a held lane sends none before its
        # end) the request's wait plus the reply's own time to its first token
        ttft = (first - started) if first is not None else (
            end - started - u.total_seconds + u.prompt_seconds)
        self.ttft.observe(max(0.0, ttft))
        if u.completion_tokens > 1:
            self.tpot.observe(max(0.0, u.total_seconds - u.prompt_seconds)
                              / (u.completion_tokens - 1))

    def wrap(self, app: Any) -> Any:
        """``app`` (a Starlette app) with every HTTP request counted by route and status:
        its routes' paths by name, any other path as ``other``."""
        routes = {r.path for r in app.routes}

        async def counted(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            status = [500]

            async def send_status(message: Any) -> None:
                if message["type"] == "http.response.start":
                    status[0] = message["status"]
                await send(message)

            try:
                await app(scope, receive, send_status)
            finally:
                route = scope["path"] if scope["path"] in routes else "other"
                self.requests.labels(route=route, status=str(status[0])).inc()

        return counted

    async def endpoint(self, request: Request) -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
        from starlette.responses import Response

        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


def open_metrics(model: StepEngine, loop: EngineLoop, lanes: Any) -> Metrics | None:
    """The server's metrics, hooked to its lanes; None (logged) without prometheus-client."""
    if not available():
        _log.info("/metrics is off: pip install 'chatkit[metrics]' (prometheus-client)")
        return None
    metrics = Metrics(model, loop)
    lanes.on_finish = metrics.finished
    return metrics


def metrics_endpoint(metrics: Metrics | None) -> Callable[[Request], Any]:
    """The ``/metrics`` handler: the scrape, or a named 501 without prometheus-client."""
    async def missing(request: Request) -> Response:
        raise RequestError(501, "metrics need prometheus-client: pip install "
                           "'chatkit[metrics]'", type="server_error", code="metrics_unavailable")

    return metrics.endpoint if metrics is not None else missing


def _cells_used(model: Forward) -> Callable[[], float]:
    pos_max = getattr(model, "seq_pos_max", None)
    n = int(getattr(model, "n_seq_ids", model.n_seq_max))

    def used() -> float:
        if pos_max is None:
            return 0.0
        with model.lock:
            return float(sum(pos_max(s) + 1 for s in range(n)))

    return used


class _Compiles:
    """The process's grammar compiles (``chatkit.chat.plan.COMPILES``), read at scrape."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        count, seconds = COMPILES.read()
        yield CounterMetricFamily("chatkit:grammar_compiles",
                                  "Grammars compiled (cache misses)", value=count)
        yield CounterMetricFamily("chatkit:grammar_compile_seconds",
                                  "Seconds spent compiling grammars", value=seconds)
