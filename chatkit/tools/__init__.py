"""Tools: definitions, their call grammars and parsers, the agent loop, MCP servers.

Job: ``@tool`` / ``Tool`` definitions (``definition``), each family's call format as a
record (``dialects``), the record from a template's renderings (``detect``; ``derive`` for
families no record knows), the call grammar and parser (``grammar``, ``parser``), executing
calls and the agent loop as a generator the conversation drives (``agent``), an MCP
server's tools as chatkit tools (``mcp``).

May import: ``errors``, ``messages``, ``engine``, ``grammar``, ``decode``.
Never imports: chat, serve, remote (the conversation drives the agent loop through
callables it passes in; a tool knows no conversation).
"""

from .definition import ModelRetry, Tool, ToolDefinition, tool

__all__ = ["ModelRetry", "Tool", "ToolDefinition", "tool"]
