"""Demo: a schema-valid reply from the embedded default model (SmolLM2-135M-Instruct).

Run with ``python3 dev.py demo``. The reply is produced under an llguidance
grammar mask built from the Pydantic model, then checked again by an
independent reader (jsonschema + Pydantic) before it is returned.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chatkit import Conversation, Model


class Planet(BaseModel):
    name: str = Field(pattern=r"^[A-Za-z0-9 '-]{1,24}$")  # bounded, no escapes
    moons: int = Field(ge=0, le=200)
    kind: Literal["rocky", "gas giant", "ice giant", "dwarf"]


def main() -> None:
    model = Model.load()
    conv = Conversation(model, system="You answer in JSON.")
    # 96 tokens cover the longest Planet the grammar allows (~70 characters), so the reply
    # completes whatever this machine's build of llama.cpp makes the model write
    reply = conv.send("Describe the planet Jupiter.", schema=Planet, max_tokens=96)
    print(f"model:  {model.name} ({model.placement.reason})")
    print(f"text:   {reply.text}")
    print(f"parsed: {reply.parsed!r}")
    print(f"finish: {reply.finish_reason}, {reply.usage.completion_tokens} tokens "
          f"in {reply.usage.total_seconds:.2f} s")


if __name__ == "__main__":
    main()
