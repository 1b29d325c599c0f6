"""Conversations and turns: the layer users call.

Job: ``Conversation`` (send / stream / run over plan + runner), a call's options resolved
(``options``), the agent loop behind ``run`` (``agent``), a turn's plan (template,
tokens, cached grammar), the ``Turn`` that steps it, text emission and the checked
outcome, partial documents, the engine loop (scheduler) and the runner that is the one
dispatch on engine kind; lockstep batches and quorum lanes.

May import: every layer below: ``errors``, ``messages``, ``engine``, ``templates``,
``grammar``, ``decode``, ``tools``.
Never imports: serve, remote, cli (a server or a remote engine is built on conversations,
never the other way).
"""

__all__: list[str] = []
