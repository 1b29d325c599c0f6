"""Tools: definitions, their options, call grammars and parsers, execution, MCP servers.

Job: ``@tool`` / ``Tool`` definitions (``definition``), each family's call format as a
record (``dialects``), the record from a template's renderings (``detect``; ``derive`` for
families no record knows), the call grammar and parser (``grammar``, ``parser``), the tool
options checked (``options``), executing calls (``execute``), an MCP server's tools as
chatkit tools (``mcp``).

May import: ``errors``, ``messages``, ``engine``, ``grammar``, ``decode``.
Never imports: chat, serve, remote (the agent loop lives in ``chat``; a tool knows no
conversation).
"""

from .definition import ModelRetry, Tool, ToolDefinition, ToolLike, Toolset, tool

__all__ = ["ModelRetry", "Tool", "ToolDefinition", "ToolLike", "Toolset", "tool"]
