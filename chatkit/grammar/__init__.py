"""Constraints: what a reply may be, and the independent check that it is.

Job: schema intake (load, meta-check, close objects, bound numbers, walk), the llguidance
``Constraint`` over any vocabulary, token masks, value checks the grammar cannot express
and the guard that runs them while decoding (rollback), the second reader
(``SchemaReader``), exact choice probabilities.

May import: ``chatkit.errors``, ``chatkit.messages``, ``chatkit.engine``.
Never imports: decode, tools, chat, serve, remote, templates (a grammar knows tokens,
never turns).
"""

__all__: list[str] = []
