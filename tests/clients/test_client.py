"""radixserve.client against the in-process fake GenerateService (sync and asyncio)."""

from __future__ import annotations

import asyncio
import socket
from contextlib import aclosing, closing

import grpc
import pytest
from radixserve.client import (
    AsyncClient,
    ChatMessage,
    Client,
    Delta,
    Finished,
    RadixServeError,
    Started,
    TopLogprob,
    wire,
)
from radixserve.v1 import generate_pb2 as pb

from .fake_server import FakeGenerateService

SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "repetition_penalty",
            "frequency_penalty", "presence_penalty")  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unset_params_stay_unset_on_the_wire(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        c.generate_text("hi")
    req = fake.seen[0].request
    assert not req.HasField("sampling")
    assert not any(req.sampling.HasField(f) for f in SAMPLING)
    assert not req.stopping.HasField("max_new_tokens")
    assert req.request_id == ""  # the gateway assigns one


def test_explicit_zero_is_sent_as_zero(fake: FakeGenerateService, target: str) -> None:
    zeros = {name: 0 for name in SAMPLING}
    with Client(target) as c:
        res = c.generate_text("hi", max_new_tokens=0, **zeros)  # type: ignore[arg-type]
    req = fake.seen[0].request
    for name in SAMPLING:
        assert req.sampling.HasField(name), name
        assert getattr(req.sampling, name) == 0
    assert req.stopping.HasField("max_new_tokens") and req.stopping.max_new_tokens == 0
    assert res.text == "" and res.finish_reason == "length"


def test_every_option_reaches_the_wire(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        c.generate_text(
            "hi", temperature=0.5, top_p=0.9, top_k=40, min_p=0.05, seed=7,
            repetition_penalty=1.1, frequency_penalty=0.2, presence_penalty=-0.3,
            max_new_tokens=64, min_new_tokens=2, stop="END", stop_token_ids=[5, 6],
            ignore_eos=True, include_stop_str=True, top_logprobs=3, logprobs=True,
            return_prompt_info=True, request_id="my-id", n=1,
        )  # fmt: skip
    r = fake.seen[0].request
    assert r.sampling.HasField("n") and r.sampling.n == 1
    s = r.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.5, pytest.approx(0.9), 40, 7)
    assert s.min_p == pytest.approx(0.05) and s.repetition_penalty == pytest.approx(1.1)
    assert s.frequency_penalty == pytest.approx(0.2) and s.presence_penalty == pytest.approx(-0.3)
    st = r.stopping
    assert (st.max_new_tokens, st.min_new_tokens, list(st.stop)) == (64, 2, ["END"])
    assert list(st.stop_token_ids) == [5, 6] and st.ignore_eos and st.include_stop_str
    opts = r.options
    assert (opts.top_logprobs, opts.logprobs, opts.return_prompt_info) == (3, True, True)
    assert r.request_id == "my-id" and r.text == "hi"


def test_n_completions_are_streamed_not_folded(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        with pytest.raises(ValueError, match="iterate generate"):
            c.generate_text("hi", n=2)
        events = list(c.generate("hi", n=2))
    assert fake.seen[0].request.sampling.n == 2
    assert all(ev.index == 0 for ev in events if isinstance(ev, (Delta, Finished)))  # one here
    assert isinstance(events[-1], Finished)


def test_prompt_kinds(fake: FakeGenerateService, target: str) -> None:
    msgs = [{"role": "system", "content": "be brief"}, ChatMessage("user", "hey")]
    with Client(target) as c:
        assert c.generate_text(token_ids=[104, 105]).text == "echo: hi"
        assert c.generate_text(messages=msgs).text == "echo: hey"
        c.generate_text(messages=msgs, add_generation_prompt=False)
        with pytest.raises(ValueError):
            c.generate("a", token_ids=[1])
        with pytest.raises(ValueError):
            c.generate()
        with pytest.raises(TypeError, match="temprature"):
            c.generate("a", temprature=0.1)  # type: ignore[call-arg]
    chat = fake.seen[1].request.chat
    assert [(m.role, m.content) for m in chat.messages] == [("system", "be brief"), ("user", "hey")]
    assert not chat.HasField("add_generation_prompt")
    assert fake.seen[2].request.chat.HasField("add_generation_prompt")
    assert list(fake.seen[0].request.token_ids.ids) == [104, 105]
    assert len(fake.seen) == 3  # bad arguments fail before any RPC


def test_events_are_typed(target: str) -> None:
    with Client(target) as c:
        events = list(c.generate("abc", top_logprobs=2))
    assert isinstance(events[0], Started) and events[0].prompt_tokens == 3
    assert events[0].request_id == "fake-1"
    deltas = [e for e in events[1:-1] if isinstance(e, Delta)]
    assert len(deltas) == len(events) - 2 == len("echo: abc")
    assert "".join(d.text for d in deltas) == "echo: abc"
    assert deltas[0].token_ids == [ord("e")]
    assert deltas[0].logprobs[0].top == [TopLogprob(0, -0.5), TopLogprob(1, -1.0)]
    fin = events[-1]
    assert isinstance(fin, Finished)
    assert fin.finish_reason == "eos" and fin.matched_stop is None
    u = fin.usage
    assert (u.prompt_tokens, u.completion_tokens, u.cached_tokens) == (3, 9, 3)
    assert fin.timings.total_seconds == pytest.approx(0.05)


def test_generate_text_result(target: str) -> None:
    with Client(target) as c:
        res = c.generate_text("abcdef", max_new_tokens=4, logprobs=True)
    assert res.text == "echo" and res.token_ids == [ord(ch) for ch in "echo"]
    assert res.finish_reason == "length" and res.usage.completion_tokens == 4
    assert res.request_id == "fake-1" and len(res.logprobs) == 4


def test_finished_conversion() -> None:
    resp = pb.GenerateResponse(
        request_id="r",
        finished=pb.Finished(finish_reason=pb.FINISH_REASON_STOP_STRING, stop_string="##"),
    )
    ev = wire.event(resp)
    assert (
        isinstance(ev, Finished) and ev.finish_reason == "stop_string" and ev.matched_stop == "##"
    )
    resp.finished.stop_token_id = 0  # an explicit token id 0 is still a match
    assert wire.event(resp).matched_stop == 0  # type: ignore[union-attr]
    assert wire.finish_reason(pb.FINISH_REASON_STOP_TOKEN) == "stop_token"
    assert wire.finish_reason(99) == "unspecified"
    assert wire.event(pb.GenerateResponse(request_id="r")) is None


@pytest.mark.parametrize(
    "code", ["INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL"]
)
def test_status_codes_become_typed_errors(target: str, code: str) -> None:
    with Client(target) as c, pytest.raises(RadixServeError) as info:
        c.generate_text(f"error:{code} prompt too long")
    assert info.value.code == grpc.StatusCode[code]
    assert info.value.message == "prompt too long"
    assert str(info.value) == f"{code}: prompt too long"


def test_unreachable_server_is_unavailable() -> None:
    with Client(f"127.0.0.1:{free_port()}") as c, pytest.raises(RadixServeError) as info:
        c.model_info(timeout=5)
    assert info.value.code == grpc.StatusCode.UNAVAILABLE


def test_deadline(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        with pytest.raises(RadixServeError) as info:
            c.generate_text("long", timeout=0.3)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert fake.seen[0].cancelled.wait(5)


def test_breaking_out_cancels_the_rpc(fake: FakeGenerateService, target: str) -> None:
    # Every check runs while the channel is open: closing it would cancel the RPC anyway.
    with Client(target) as c:
        with closing(c.generate("long")) as stream:
            for i, _ in enumerate(stream):
                if i == 3:
                    break
            assert not fake.seen[0].cancelled.wait(0.3)  # a paused consumer is not a cancel
        assert fake.seen[0].cancelled.wait(5)
        # A bare break on an unreferenced generator cancels too (CPython closes it at once).
        for i, _ in enumerate(c.generate("long")):
            if i == 3:
                break
        assert fake.wait_for(2).cancelled.wait(5)


def test_exception_in_consumer_cancels_the_rpc(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        with pytest.raises(KeyboardInterrupt):
            for ev in c.generate("long"):
                if isinstance(ev, Delta):
                    raise KeyboardInterrupt
        assert fake.seen[0].cancelled.wait(5)


def test_finished_stream_is_not_reported_as_cancelled(
    fake: FakeGenerateService, target: str
) -> None:
    with Client(target) as c:
        c.generate_text("hello")
    assert fake.seen[0].done.is_set() and not fake.seen[0].cancelled.wait(0.2)


def test_api_key_goes_in_bearer_metadata(fake: FakeGenerateService, target: str) -> None:
    with Client(target, api_key="sekret") as c:
        c.generate_text("a")
        c.model_info()
    with Client(target) as c:
        c.generate_text("b")
    assert fake.seen[0].metadata["authorization"] == "Bearer sekret"
    assert "authorization" not in fake.seen[1].metadata


def test_unary_calls(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        assert c.tokenize("ab") == [1, 97, 98]
        assert c.tokenize("ab", add_special_tokens=False) == [97, 98]
        assert c.tokenize(messages=[ChatMessage("user", "x")], add_special_tokens=False)[:3] == [
            ord("<"), ord("u"), ord("s")]  # fmt: skip
        assert c.detokenize([104, 105]) == "hi"
        assert c.abort("r1") == 1 and c.abort(["r2", "r3"]) == 2
        info = c.model_info()
        stats = c.server_info()
    assert fake.aborted == ["r1", "r2", "r3"]
    assert info.model_name == "fake-model" and info.eos_token_ids == [2] and info.has_chat_template
    assert (stats.running_requests, stats.waiting_requests, stats.kv_pages_free) == (1, 2, 60)
    assert stats.prefix_cache_hit_rate == 0.25 and stats.page_size == 16


def test_connections_take_generate_calls_in_turn_and_abort_asks_each(
        fake: FakeGenerateService, target: str) -> None:
    """`serve --gateways K` gives each connection to one gateway, and only that gateway knows
    the requests of its calls: Generate calls go over the connections in turn, abort over all."""
    with Client(target) as c:
        for i in range(3):
            c.generate_text(f"one {i}", max_new_tokens=1)
        assert c.abort("x") == 1
    assert len({s.peer for s in fake.seen}) == 1 and len(set(fake.abort_peers)) == 1
    with Client(target, connections=3) as c:
        for i in range(6):
            assert c.generate_text(f"three {i}", max_new_tokens=2).text == "ec"
        assert c.abort(["y", "z"]) == 6  # each connection's gateway answers for what it had
        assert c.tokenize("ab") == [1, 97, 98]
    peers = [s.peer for s in fake.seen[3:]]
    assert len(set(peers)) == 3 and peers[:3] == peers[3:]  # three connections, in turn
    assert set(fake.abort_peers[1:]) == set(peers) and len(fake.abort_peers) == 4
    with pytest.raises(ValueError, match="connections must be at least 1"):
        Client(target, connections=0)


# --- asyncio ----------------------------------------------------------------------------------


def test_async_generate_and_params(fake: FakeGenerateService, target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target, api_key="k") as c:
            events = [ev async for ev in c.generate("abc", temperature=0)]
            res = await c.generate_text(
                messages=[{"role": "user", "content": "yo"}], max_new_tokens=3
            )
            assert isinstance(events[0], Started) and isinstance(events[-1], Finished)
            assert "".join(e.text for e in events if isinstance(e, Delta)) == "echo: abc"
            assert (res.text, res.finish_reason) == ("ech", "length")

    asyncio.run(main())
    first = fake.seen[0]
    sampling = first.request.sampling
    assert sampling.HasField("temperature") and sampling.temperature == 0
    assert not sampling.HasField("top_p")
    assert first.metadata["authorization"] == "Bearer k"


def test_async_errors(target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target) as c:
            with pytest.raises(RadixServeError) as info:
                await c.generate_text("error:INVALID_ARGUMENT bad")
            assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.message == "bad"
        async with AsyncClient(f"127.0.0.1:{free_port()}") as c:
            with pytest.raises(RadixServeError) as info:
                await c.server_info(timeout=5)
            assert info.value.code == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())


def test_async_cancellation_reaches_server(fake: FakeGenerateService, target: str) -> None:
    async def consume(c: AsyncClient) -> None:
        async for _ in c.generate("long"):
            pass

    async def main() -> None:
        async with AsyncClient(target) as c:
            # aclose() on an early exit.
            async with aclosing(c.generate("long")) as stream:
                async for ev in stream:
                    if isinstance(ev, Delta):
                        break
            assert await asyncio.to_thread(fake.seen[0].cancelled.wait, 5)
            # Cancelling the consuming task.
            task = asyncio.create_task(consume(c))
            await asyncio.sleep(0.2)
            assert not fake.wait_for(2).cancelled.is_set()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await asyncio.to_thread(fake.seen[1].cancelled.wait, 5)

    asyncio.run(main())


def test_async_connections_take_generate_calls_in_turn_and_abort_asks_each(
        fake: FakeGenerateService, target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target, connections=2) as c:
            for i in range(4):
                assert (await c.generate_text(f"two {i}", max_new_tokens=1)).text == "e"
            assert await c.abort("x") == 2

    asyncio.run(main())
    peers = [s.peer for s in fake.seen]
    assert len(set(peers)) == 2 and peers[:2] == peers[2:]
    assert set(fake.abort_peers) == set(peers)


def test_async_unary_calls(target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target) as c:
            assert await c.tokenize("a", add_special_tokens=False) == [97]
            assert await c.detokenize([97]) == "a"
            assert await c.abort("x") == 1
            assert (await c.model_info()).vocab_size == 1000
            assert (await c.server_info()).kv_pages_total == 100

    asyncio.run(main())


# --- structured output --------------------------------------------------------------------------


@pytest.mark.parametrize("kw,field,text", [
    ({"json_schema": '{"type": "string"}'}, "json_schema", '{"type": "string"}'),
    ({"json_schema": {"enum": ["a", "b"]}}, "json_schema", '{"enum": ["a", "b"]}'),
    ({"regex": "[ab]{1,3}"}, "regex", "[ab]{1,3}"),
    ({"ebnf": 'root ::= "x"'}, "ebnf", 'root ::= "x"'),
])  # fmt: skip
def test_constraint_reaches_the_wire(fake: FakeGenerateService, target: str, kw: dict,
                                     field: str, text: str) -> None:
    with Client(target) as c:
        c.generate_text("hi", **kw)
        unset = {k: None for k in ("json_schema", "regex", "ebnf") if k not in kw}
        list(c.generate("hi", **kw, **unset))  # None stays unset, as for every option
    for seen in fake.seen:
        assert seen.request.sampling.WhichOneof("constraint") == field
        assert getattr(seen.request.sampling, field) == text


def test_no_constraint_by_default_and_at_most_one(fake: FakeGenerateService, target: str) -> None:
    with Client(target) as c:
        c.generate_text("hi")
        with pytest.raises(ValueError, match="at most one of json_schema, regex, ebnf"):
            c.generate_text("hi", regex="a", ebnf='root ::= "a"')
    assert fake.seen[0].request.sampling.WhichOneof("constraint") is None
    assert len(fake.seen) == 1  # the bad call never left the client


def test_async_constraint_reaches_the_wire(fake: FakeGenerateService, target: str) -> None:
    async def main() -> None:
        async with AsyncClient(target) as c:
            await c.generate_text("hi", json_schema={"type": "integer"})
            async with aclosing(c.generate("hi", ebnf='root ::= "a"')) as stream:
                assert [ev async for ev in stream]

    asyncio.run(main())
    first, second = (s.request.sampling for s in fake.seen)
    assert first.json_schema == '{"type": "integer"}'
    assert second.WhichOneof("constraint") == "ebnf" and second.ebnf == 'root ::= "a"'
