"""The llama.cpp binding: what runs a model and nothing about chats.

Job: the engine seam (``protocols``: ``Vocabulary``, ``StepEngine``, ``GenerateEngine``,
``SeqChunk``), ``Model`` over llama.cpp's low-level API, the vocabulary, KV sequence leases,
backends and placement, the compute thread, llama.cpp's log, the per-engine capacity
limiter; ``coldstart/``: the helpers of a new process's way to its first token (bare
imports, the disk cache, llguidance's tokenizer built while the weights load).

May import: ``chatkit.errors`` and ``chatkit.messages`` only.
Never imports: templates, grammar, decode, tools, chat, serve, remote (a layer above
knows the engine; the engine knows no layer above it).
"""

__all__: list[str] = []
