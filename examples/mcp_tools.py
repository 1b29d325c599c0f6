"""Tools from an MCP server in the agent loop, beside a Python tool.

Run with ``.venv/bin/python examples/mcp_tools.py`` (needs the ``mcp`` extra, which
``python3 dev.py`` installs). The file is both sides: run plainly it is the client, which
starts itself with ``--serve`` as a small MCP server over stdio (the mcp SDK's MCPServer).
The model's first call is named (``tool_choice``), and ``tool_call_threshold=1.0`` makes it
answer after the result, under a schema.
"""

from __future__ import annotations

import sys
from typing import Annotated

from pydantic import BaseModel, Field


def serve() -> None:
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("weather")

    @server.tool()
    def forecast(city: Annotated[str, Field(max_length=40)]) -> str:
        """Tomorrow's forecast for a city."""
        return f"Tomorrow in {city}: 18 degrees, light rain."

    server.run()


class Plan(BaseModel):
    city: str = Field(pattern=r"^[A-Za-z .'-]{1,40}$")
    umbrella: bool


def main() -> None:
    from chatkit import Conversation, MCPToolset, Model, tool

    @tool
    def packing_list(items: Annotated[list[Annotated[str, Field(max_length=20)]],
                                      Field(max_length=5)]) -> str:
        """Write down a packing list."""
        return "saved"

    model = Model.load()
    with MCPToolset.stdio([sys.executable, __file__, "--serve"]) as weather:
        conv = Conversation(model, system="You plan trips.")
        reply = conv.run("I am going to Bergen tomorrow. Do I need an umbrella?",
                         tools=[*weather.tools(), packing_list], tool_choice="forecast",
                         tool_call_threshold=1.0, schema=Plan, max_steps=3)
    for message in conv.messages:
        if message.role == "tool":
            print(f"tool {message.name}: {message.content}")
    print(f"answer: {reply.parsed!r}")


if __name__ == "__main__":
    serve() if "--serve" in sys.argv else main()
