"""``GET /metrics`` (chatkit.serve.metrics): Prometheus' text format, read back with
prometheus-client's own parser; every metric moves when a request runs."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from chatkit import Model
from chatkit.serve.server import ChatkitServer
from tests.helpers import Biased
from tests.test_checks import UNIQUE_XY, _letter_tokens
from tests.test_server import _Running

parser = pytest.importorskip("prometheus_client.parser")


def _scrape(base: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    r = httpx.get(base + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parser.text_string_to_metric_families(r.text)
            for s in family.samples}


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _chat(base: str, content: str, **extra: Any) -> httpx.Response:
    return httpx.post(base + "/v1/chat/completions", timeout=120, json={
        "model": "m", "max_tokens": 12, "temperature": 0,
        "messages": [{"role": "system", "content": "You are terse. " * 20},
                     {"role": "user", "content": content}], **extra})


def test_every_metric_moves_when_requests_run(smol: Model) -> None:
    """Seen failing with the lanes' finish hook unplugged (the token counters and the
    latency histograms stay at 0) and with the middleware left out (no request counted)."""
    # the model insists on "x": UNIQUE_XY's second "x" rolls back (a rollback counted)
    engine = Biased(smol, _letter_tokens(smol, "x"))
    with _Running(ChatkitServer(engine, name="m")) as running:  # type: ignore[arg-type]
        base = running.base
        before = _scrape(base)
        assert _chat(base, "Hi there.").status_code == 200
        assert _chat(base, "Hi there.").status_code == 200  # its prompt is cached now
        schema = {"type": "json_schema", "json_schema": {"name": "xy", "schema": UNIQUE_XY}}
        assert _chat(base, "Two letters.", response_format=schema).status_code == 200
        assert httpx.get(base + "/nowhere", timeout=10).status_code == 404
        seen: list[dict[Any, float]] = []  # gauges scraped while a stream runs

        def stream() -> None:
            body = {"model": "m", "max_tokens": 40, "stream": True,
                    "messages": [{"role": "user", "content": "Count."}]}
            with httpx.stream("POST", base + "/v1/chat/completions", json=body,
                              timeout=120) as r:
                for i, _ in enumerate(r.iter_lines()):
                    if i == 3:
                        seen.append(_scrape(base))

        t = threading.Thread(target=stream)
        t.start()
        t.join(120)
        after = _scrape(base)

    def moved(name: str, **labels: str) -> float:
        return _value(after, name, **labels) - _value(before, name, **labels)

    assert moved("chatkit:requests_total", route="/v1/chat/completions", status="200") == 4
    assert moved("chatkit:requests_total", route="other", status="404") == 1
    assert moved("chatkit:request_success_total", finished_reason="length") >= 1
    assert moved("chatkit:request_success_total", finished_reason="stop") >= 1
    assert moved("chatkit:prompt_tokens_total") > 0
    assert moved("chatkit:prefix_cache_hits_total") > 0
    assert moved("chatkit:generation_tokens_total") > 0
    assert moved("chatkit:rollbacks_total") >= 1
    assert moved("chatkit:grammar_compiles_total") >= 1
    assert moved("chatkit:grammar_compile_seconds_total") > 0
    for histogram in ("time_to_first_token_seconds", "time_per_output_token_seconds",
                      "e2e_request_latency_seconds"):
        assert moved(f"chatkit:{histogram}_count") == 4, histogram
        assert moved(f"chatkit:{histogram}_sum") > 0, histogram
    (during,) = seen
    assert _value(during, "chatkit:num_requests_running") == 1
    assert _value(during, "chatkit:num_requests_waiting") == 0
    assert _value(during, "chatkit:kv_cache_used_cells") > 0
    assert 0 < _value(during, "chatkit:kv_cache_usage_perc") <= 1
