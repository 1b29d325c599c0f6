"""``chatkit serve``: HTTP APIs over the chat layer.

Job: the Starlette app and routes (``server``), one module per wire API (OpenAI chat and
completions in ``openai_api``, the Responses API in ``responses_api``, Anthropic Messages in
``anthropic_api`` and its routes in ``anthropic_routes``), the body reader and key check
(``http``), the one stream driver (``sse``) and markup read into deltas (``stream_deltas``),
a request's lanes on the engine loop (``lanes``), draining on SIGTERM (``shutdown``),
Prometheus metrics (``metrics``), and each sequence's context and the KV layout the command
line asks for (``sizing``).

May import: every layer below (``chat`` and what it stands on).
Never imports: ``chatkit.cli`` (the command starts the server, not the reverse).
"""

__all__: list[str] = []
