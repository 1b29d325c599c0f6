"""A verdict lane: one judgement, always a valid Verdict or a named error."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chatkit import ChatkitError, Conversation, Model, SamplingParams


class Verdict(BaseModel):
    decision: Literal["approve", "reject", "abstain"]
    confidence: float = Field(ge=0, le=1)
    reasons: list[str] = Field(max_length=3)


CLAIM = "A pull request that deletes all tests to make CI green."


def main() -> None:
    model = Model.load()
    for seed in (1, 2, 3):
        conv = Conversation(model, system="You review changes. Answer with a verdict.",
                            sampling=SamplingParams(temperature=0.7, seed=seed))
        try:
            verdict = conv.send(f"Review: {CLAIM}", schema=Verdict, max_tokens=120).parsed
            print(f"lane {seed}: {verdict.decision} ({verdict.confidence:.2f})")
        except ChatkitError as exc:  # Truncated, SchemaViolation, ...: named, never silent
            print(f"lane {seed}: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
