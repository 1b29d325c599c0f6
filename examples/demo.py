"""Demo: a schema-valid reply from the embedded default model (SmolLM2-135M-Instruct).

Run with ``python3 dev.py demo``. The reply is produced under an llguidance
grammar mask built from the Pydantic model, then checked again by an
independent reader (jsonschema + Pydantic) before it is printed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chatkit import Constraint, Model, Sampler, SamplingParams, Truncated, generate


class Planet(BaseModel):
    name: str = Field(max_length=24)
    moons: int = Field(ge=0, le=200)
    kind: Literal["rocky", "gas giant", "ice giant", "dwarf"]


def chatml(model: Model, system: str, user: str) -> list[int]:
    """Segment-safe prompt: markup parsed for special tokens, message text never."""
    ids: list[int] = []
    for role, text in (("system", system), ("user", user)):
        ids += model.tokenize(f"<|im_start|>{role}\n", special=True)
        ids += model.tokenize(text, special=False)
        ids += model.tokenize("<|im_end|>\n", special=True)
    return ids + model.tokenize("<|im_start|>assistant\n", special=True)


def main() -> None:
    model = Model.load()
    constraint = Constraint.json_schema(Planet, model=model)
    prompt = chatml(model, "You answer in JSON.", "Describe the planet Jupiter.")
    gen = generate(model, prompt, Sampler(SamplingParams(), constraint), max_tokens=64)
    if not constraint.is_stopped():
        raise Truncated(gen.text, 64)
    assert constraint.reader is not None
    planet = constraint.reader.read(gen.text)  # SchemaViolation if the second reader disagrees
    print(f"model:  {model.name}")
    print(f"text:   {gen.text}")
    print(f"parsed: {planet!r}")
    print(f"finish: {gen.finish_reason}, {len(gen.tokens)} tokens in {gen.seconds:.2f} s")


if __name__ == "__main__":
    main()
