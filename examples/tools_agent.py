"""An agent with two tools (calculator and weather): the model calls them, the loop runs
them, feeds the results back, and the model answers."""

from __future__ import annotations

from chatkit import Conversation, Model, tool


@tool
def calculate(a: float, b: float, op: str = "+") -> float:
    """Apply an arithmetic operation to two numbers.

    Args:
        a: The first number.
        b: The second number.
        op: One of + - * /.
    """
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b if b else float("nan")}[op]


@tool
def get_weather(city: str) -> str:
    """Get the current weather in a city.

    Args:
        city: The city name.
    """
    return {"paris": "18 C, light rain"}.get(city.lower(), "22 C, sunny")


def main() -> None:
    conv = Conversation(Model.load(), system="You are a helpful assistant with tools.")
    answer = conv.run("What's the weather in Paris?", tools=[get_weather, calculate],
                      tool_choice="required", max_steps=4, max_tokens=100)
    for m in conv.messages:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in m.tool_calls)
        print(f"{m.role}: {m.content!r}" + (f" calls {calls}" if calls else ""))
    print(f"final: {answer.text!r} ({answer.finish_reason})")


if __name__ == "__main__":
    main()
