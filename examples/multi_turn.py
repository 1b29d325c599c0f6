"""A multi-turn chat: free text, then a structured answer about what was said.

The prompt prefix is reused from the KV cache: each turn evaluates only its new suffix.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from chatkit import Conversation, Model


class Summary(BaseModel):
    topic: str = Field(max_length=30)
    sentiment: int = Field(ge=-2, le=2)


def main() -> None:
    conv = Conversation(Model.load(), system="You are a friendly assistant.")
    for text in ("I just adopted a puppy!", "She chewed my shoes today."):
        reply = conv.send(text, max_tokens=40)
        print(f"user: {text}\nassistant: {reply.text}")
        print(f"  (prompt {reply.usage.prompt_tokens} tokens, "
              f"{reply.usage.cached_prompt_tokens} reused from cache)")
    summary = conv.send("Summarise our chat.", schema=Summary, max_tokens=48).parsed
    print("summary:", summary)


if __name__ == "__main__":
    main()
