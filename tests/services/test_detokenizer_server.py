"""The detokenizer's Process stream: steps are read, and stamped, as they arrive."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import grpc
from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as pb
from radixserve.internal.detokenizer.v1 import detokenizer_pb2_grpc as pb_grpc
from radixserve.services.detokenizer import server as detok_server


class _SlowDetokenizer:
    """Each push takes `seconds`, as a real decode of hundreds of rows takes milliseconds."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds

    def push(self, ids):
        time.sleep(self._seconds)
        return SimpleNamespace(text=f"<{len(ids)}>", stopped=None)

    def flush(self) -> str:
        return ""


def test_a_step_that_arrives_while_one_is_applied_is_stamped_on_arrival() -> None:
    """The received stamp is the step's arrival, not the moment the worker was free: the second
    step, sent at once after the first, was received before the first was detokenized, so a
    backlog shows between received and detokenized (what `bench serving`'s hops report)."""

    async def main() -> list[pb.SubscribeResponse]:
        served = await detok_server.create_server("127.0.0.1:0",
                                                  lambda setup: _SlowDetokenizer(0.5))
        await served.server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{served.port}") as channel:
                stub = pb_grpc.DetokenizerServiceStub(channel)
                subscription = stub.Subscribe(pb.SubscribeRequest())
                await subscription.initial_metadata()
                process = stub.Process()
                await process.wait_for_connection()
                first = pb.ProcessRequest(step_unix_ns=time.time_ns(), setups=[
                    pb.RequestSetup(request_id="a", prompt_ids=[1, 2])])
                first.outputs.add(request_id="a", token_ids=[3])
                second = pb.ProcessRequest(step_unix_ns=time.time_ns())
                second.outputs.add(request_id="a", token_ids=[4])
                await process.write(first)
                await process.write(second)
                got = [await asyncio.wait_for(subscription.read(), 10) for _ in range(2)]
                await process.done_writing()
                subscription.cancel()
                return got
        finally:
            await served.server.stop(None)

    first, second = asyncio.run(main())
    assert list(first.plain_request_ids) == ["a"] and list(second.plain_request_ids) == ["a"]
    assert first.received_unix_ns <= first.detokenized_unix_ns
    assert second.received_unix_ns < first.detokenized_unix_ns  # read while the first was applied


def test_hf_factory_builds_one_byte_table_that_every_request_decodes_with(
    demo_path: str, monkeypatch
) -> None:
    """A byte-level tokenizer's detokenizers take the byte path, all through the one table the
    factory built (building reads the whole vocabulary, too slow for each request)."""
    from radixserve.engine import detokenize
    from radixserve.services.detokenizer.state import Setup
    from transformers import AutoTokenizer

    built, given = [], []
    real_table = detokenize.byte_table
    monkeypatch.setattr(detokenize, "byte_table", lambda tok: built.append(tok) or real_table(tok))

    class Recording(detokenize.IncrementalDetokenizer):
        def __init__(self, tokenizer, *args) -> None:
            given.append(tokenizer)
            super().__init__(tokenizer, *args)

    monkeypatch.setattr(detokenize, "IncrementalDetokenizer", Recording)
    tokenizer = AutoTokenizer.from_pretrained(demo_path)
    factory = detok_server.hf_factory(tokenizer)
    ids = tokenizer.encode(" Café 🙂 and 你好")
    for rid in ("a", "b"):
        detok = factory(Setup(rid, [1, 2]))
        assert "".join([detok.push([i]).text for i in ids] + [detok.flush()]) == " Café 🙂 and 你好"
    assert len(built) == 1 and len(given) == 2 and given[0] is given[1]
    assert isinstance(given[0], detokenize.ByteTable)
