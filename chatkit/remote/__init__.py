"""Remote engines: the ``GenerateEngine`` side of the seam, over HTTP.

Job: ``RemoteEngine`` (one retry decision, the llama-server probe, SSE) and one
``ServerKind`` per kind of server (``servers.py``: request body, result, what it can enforce).

May import: ``chatkit.errors``, ``chatkit.messages``, ``chatkit.engine``, ``chatkit.grammar``.
Never imports: decode, tools, chat, serve (the chat layer drives a remote engine through
the engine protocols; the remote engine knows no conversation).
"""

__all__: list[str] = []
