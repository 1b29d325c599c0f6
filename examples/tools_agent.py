"""An agent with two tools (calculator and weather): the model calls them, the loop runs
them, feeds the results back, and the model answers.

The first turn must call a tool (``tool_choice="required"``); ``tool_call_threshold=1.0``
then makes the later turns answer in text, so the loop ends on any build of llama.cpp
(a small model otherwise may keep calling until ``max_steps``: ``MaxStepsExceeded``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from chatkit import Conversation, Model, tool


@tool
def calculate(a: float, b: float, op: Literal["+", "-", "*", "/"] = "+") -> float:
    """Apply an arithmetic operation to two numbers.

    Args:
        a: The first number.
        b: The second number.
        op: One of + - * /.
    """
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]


@tool
def get_weather(city: Annotated[str, Field(max_length=40)]) -> str:
    """Get the current weather in a city.

    Args:
        city: The city name.
    """
    return {"paris": "18 C, light rain"}.get(city.lower(), "22 C, sunny")


def main() -> None:
    conv = Conversation(Model.load(), system="You are a helpful assistant with tools.")
    answer = conv.run("What's the weather in Paris?", tools=[get_weather, calculate],
                      tool_choice="required", tool_call_threshold=1.0, max_steps=4,
                      parallel_tool_calls=False, max_tokens=200)  # one call fits 200 tokens
    for m in conv.messages:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        print(f"{m.role}: {m.content!r}" + (f" calls {calls}" if calls else ""))
    print(f"final: {answer.text!r} ({answer.finish_reason})")


if __name__ == "__main__":
    main()
