"""Tools: typed functions and Pydantic models as Hermes ``<tool_call>`` grammars.

This package holds definitions (:mod:`.definition`) and the grammar and parser
(:mod:`.grammar`) only; the agent loop that runs tools is :mod:`chatkit.agent`.
"""

from .definition import ModelRetry, Tool, ToolDefinition, tool

__all__ = ["ModelRetry", "Tool", "ToolDefinition", "tool"]
