"""Positive control for tests/test_api.py: mypy --strict must reject this file."""

from __future__ import annotations

from typing import assert_type

from pydantic import BaseModel

from chatkit import Conversation, Model


class Verdict(BaseModel):
    decision: str


def wrong() -> None:
    reply = Conversation(Model.load()).send("Judge.", schema=Verdict)
    assert_type(reply.parsed, int)  # wrong on purpose
    Conversation(Model.load()).send("Judge.", max_token=3)  # a misspelt option
    Model.load().copies_prefixes = False  # a lent value the model keeps read-only
