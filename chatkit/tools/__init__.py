"""Tools: typed functions and Pydantic models as Hermes ``<tool_call>`` grammars."""

from .definition import ModelRetry, Tool, ToolDefinition, check_tools, tool
from .grammar import parse_calls, tool_grammar

__all__ = ["ModelRetry", "Tool", "ToolDefinition", "check_tools", "parse_calls", "tool",
           "tool_grammar"]
