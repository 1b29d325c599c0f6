"""Async twins: asend equals send; cancelled streams leave history alone; concurrency is safe."""

from __future__ import annotations

import anyio

from chatkit import Conversation, Model
from tests.test_conversation import Verdict


def test_asend_equals_send(smol: Model) -> None:
    sync = Conversation(smol).send("Judge: snow is white.", schema=Verdict, max_tokens=80)

    async def main() -> str:
        reply = await Conversation(smol).asend("Judge: snow is white.", schema=Verdict,
                                               max_tokens=80)
        return reply.text

    assert anyio.run(main) == sync.text


def test_cancelled_astream_leaves_history_unchanged(smol: Model) -> None:
    conv = Conversation(smol)

    async def main() -> list[str]:
        got: list[str] = []
        with anyio.move_on_after(10):
            async for delta in conv.astream("Count slowly from one to fifty.", max_tokens=60):
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
    assert conv.send("Say hi.", max_tokens=8).text  # still consistent


def test_two_conversations_concurrently_on_one_model(smol: Model) -> None:
    claims = ["the sun is cold", "ice is hot"]
    alone = [Conversation(smol).send(f"Judge: {c}.", schema=Verdict, max_tokens=80).text
             for c in claims]

    async def main() -> list[str]:
        out = ["", ""]

        async def one(i: int) -> None:
            r = await Conversation(smol).asend(f"Judge: {claims[i]}.", schema=Verdict,
                                               max_tokens=80)
            out[i] = r.text

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, 0)
            tg.start_soon(one, 1)
        return out

    assert anyio.run(main) == alone
