"""Quorum verdict lanes: five lanes of one question in one lockstep batch, then a vote.

The lanes differ by seed; their shared prompt prefix is evaluated once and copied
to every lane's KV sequence. A lane that fails keeps its named error.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from chatkit import Model, quorum


class Verdict(BaseModel):
    decision: Literal["approve", "reject", "abstain"]
    confidence: float = Field(ge=0, le=1)
    reasons: list[str] = Field(max_length=2)


def main() -> None:
    # One shared KV pool, so the lanes' common prompt is evaluated once and copied.
    model = Model.load(n_seq_max=8, kv_unified=True)
    result = quorum(model, "Review: a pull request that deletes all tests to make CI green.",
                    schema=Verdict, lanes=5, system="You review code changes.",
                    max_tokens=120)
    for i, reply in enumerate(result.replies):
        if isinstance(reply, Exception):
            print(f"lane {i}: {type(reply).__name__}")
        else:
            print(f"lane {i}: {reply.text}  (prompt tokens reused: "
                  f"{reply.usage.cached_prompt_tokens})")
    print(f"votes: {result.votes}")
    print(f"decision: {result.decision} (tie: {result.tie}, dissent: {result.dissent}, "
          f"failures: {sorted(result.failures)})")


if __name__ == "__main__":
    main()
