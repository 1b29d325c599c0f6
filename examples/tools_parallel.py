"""Parallel tool calls: several <tool_call> blocks in one turn, executed concurrently."""

from __future__ import annotations

import anyio

from chatkit import Conversation, Model, execute_calls, tool


@tool
async def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    await anyio.sleep(0.2)  # an I/O-bound lookup: the calls overlap
    return f"22 C in {city}"


async def main() -> None:
    conv = Conversation(Model.load())
    reply = await conv.asend("Weather in Paris, Rome and Oslo?", tools=[get_weather],
                             tool_choice="required", parallel_tool_calls=3, max_tokens=160)
    print(f"{len(reply.tool_calls)} calls: " + ", ".join(c.arguments["city"]
                                                          for c in reply.tool_calls))
    results = await execute_calls(reply.tool_calls, [get_weather])
    for r in results:
        print(f"{r.call.name}({r.call.arguments}) -> {r.content}")


if __name__ == "__main__":
    anyio.run(main)
