"""Decoding: choosing tokens under a processor, one step at a time.

Job: ``SamplingParams`` and the ``Sampler`` with its processor protocols, the decoding options
checked (``options``), the ``Decoder`` (plain and speculative verify) with the one
finish rule, draft sources for speculation.

May import: ``chatkit.errors``, ``chatkit.messages``, ``chatkit.engine``, ``chatkit.grammar``.
Never imports: templates, tools, chat, serve, remote.
"""

__all__: list[str] = []
