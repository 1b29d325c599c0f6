"""Async twins: asend equals send; cancelled streams leave history alone; concurrency is safe."""

from __future__ import annotations

import anyio
import pytest

from chatkit import Conversation, Model
from tests.helpers import VERDICT_MAX_TOKENS, Verdict


def test_asend_equals_send(smol: Model) -> None:
    sync = Conversation(smol).send("Judge: snow is white.", schema=Verdict,
                                   max_tokens=VERDICT_MAX_TOKENS)

    async def main() -> str:
        reply = await Conversation(smol).asend("Judge: snow is white.", schema=Verdict,
                                               max_tokens=VERDICT_MAX_TOKENS)
        return reply.text

    assert anyio.run(main) == sync.text


# A reply that cannot end within its max_tokens: at least 4000 characters.
ENDLESS = {"type": "string", "minLength": 4000}


def test_cancelled_astream_leaves_history_unchanged(smol: Model) -> None:
    conv = Conversation(smol)

    async def main() -> list[str]:
        got: list[str] = []
        with anyio.move_on_after(60):
            async for delta in conv.astream("Count slowly from one to fifty.", schema=ENDLESS,
                                            max_tokens=60):
                got.append(delta)
                if len(got) == 3:
                    break
        with anyio.CancelScope() as scope:
            scope.cancel()
            async for delta in conv.astream("Another one.", max_tokens=20):
                got.append(delta)  # pragma: no cover - cancelled before the first step
        return got

    got = anyio.run(main)
    assert len(got) == 3
    assert conv.messages == []
    conv.send("Say hi.", max_tokens=8)  # still consistent: the first turn recorded
    assert [m.role for m in conv.messages] == ["user", "assistant"]


@pytest.mark.bitwise  # two sequences in one decode against each alone
def test_two_conversations_concurrently_on_one_model(smol: Model) -> None:
    claims = ["the sun is cold", "ice is hot"]
    alone = [Conversation(smol).send(f"Judge: {c}.", schema=Verdict,
                                     max_tokens=VERDICT_MAX_TOKENS).text for c in claims]

    async def main() -> list[str]:
        out = ["", ""]

        async def one(i: int) -> None:
            r = await Conversation(smol).asend(f"Judge: {claims[i]}.", schema=Verdict,
                                               max_tokens=VERDICT_MAX_TOKENS)
            out[i] = r.text

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            tg.start_soon(one, 1)
        return out

    assert anyio.run(main) == alone


def test_speculative_astream_equals_send_and_a_consumer_that_leaves_frees_its_lease(
        smol: Model) -> None:
    """A speculative turn steps on the caller's side (in worker threads for async code):
    its deltas make the sync reply, and leaving the loop early ends the lease."""
    sync = Conversation(smol).send("Judge: snow is white.", schema=Verdict,
                                   max_tokens=VERDICT_MAX_TOKENS, speculative=True)
    free = smol.free_seqs()

    async def main() -> tuple[str, str]:
        stream = Conversation(smol).astream("Judge: snow is white.", schema=Verdict,
                                            max_tokens=VERDICT_MAX_TOKENS, speculative=True)
        text = "".join([d async for d in stream])
        assert stream.reply is not None and stream.reply.text == text
        left = Conversation(smol).astream("Count slowly from one to fifty.", schema=ENDLESS,
                                          max_tokens=60, speculative=True)
        async for _ in left:
            break
        return text, sync.text

    got, want = anyio.run(main)
    assert got == want
    assert smol.free_seqs() == free
