"""What a new process needs on its way to the first token, and nothing else: the compiled
cores imported without their packages' ``__init__`` (``bare_import``), chatkit's cache
folder (``diskcache``), llguidance's end-of-turn tokenizer built while the weights load
(``llg_prebuild``). ``bench coldstart`` measures the path.

Job: keep a new process's start short; every helper here is a cost avoided, never a
behaviour of its own (without it, the same thing is built the slow way).
May import: the engine's own modules, ``chatkit.errors``.
Never imports: anything above the engine (templates, grammar, decode, tools, chat, serve,
remote).
"""

__all__: list[str] = []
