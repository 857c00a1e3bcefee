"""Bad inputs (docs/reliability.md #1-8) against the real stack: each gets the right status, names
the problem, reaches no engine, and the server keeps serving."""

from __future__ import annotations

import math
import random
import time

import grpc
import pytest
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import Stack, collect, request

INVALID = grpc.StatusCode.INVALID_ARGUMENT
CONTEXT, VOCAB = 4096, 1024


def _assert_serving(stack: Stack) -> None:
    ok = collect(stack.stub, request([5, 6], max_new_tokens=1))
    assert ok.code == grpc.StatusCode.OK, ok.details


def _expect(stack: Stack, req: pb.GenerateRequest, code: grpc.StatusCode, *fragments: str) -> None:
    t0 = time.monotonic()
    res = collect(stack.stub, req)
    elapsed = time.monotonic() - t0
    assert res.code == code, (res.code, res.details)
    assert res.responses == [], "a rejected request must not have started"
    for fragment in fragments:
        assert fragment in res.details, (fragment, res.details)
    # Validation answers without waiting for the engine (the budget is loose: shared CPU in CI).
    assert elapsed < 2.0, elapsed


@pytest.mark.parametrize(
    ("prompt", "max_new", "fragments"),
    [
        ([7] * (CONTEXT + 904), 1, ("5000 tokens in prompt", "limit 4096")),  # 1: over
        ([7] * CONTEXT, None, ("4096 tokens in prompt", "limit 4096")),  # 1: exactly the context
        ([7] * 4000, 200, ("4000 in prompt, 200 requested, limit 4096",)),  # 2
        ("word " * 6000, 1, ("tokens in prompt", "limit 4096")),  # 1: long text
    ],
    ids=["over-context", "exactly-context", "prompt-plus-max-new", "long-text"],
)
def test_lengths(stack: Stack, prompt: object, max_new: int | None,
                 fragments: tuple[str, ...]) -> None:
    _expect(stack, request(prompt, max_new_tokens=max_new), INVALID, *fragments)
    _assert_serving(stack)


@pytest.mark.parametrize(
    ("req", "fragment"),
    [
        (pb.GenerateRequest(text=""), "empty"),
        (pb.GenerateRequest(token_ids=pb.TokenIds()), "empty"),
        (pb.GenerateRequest(), "prompt is required"),
        (request([("user", "  \n\t ")]), "whitespace"),
        (pb.GenerateRequest(chat=pb.ChatMessages()), "at least one message"),
        (request([("", "hi")]), "empty role"),
        (request([5, VOCAB]), "outside the vocabulary"),
        (request([5, 2**32 - 1]), "outside the vocabulary"),
        (request([5], request_id="x" * 300), "request_id"),
    ],
    ids=["empty-text", "empty-ids", "no-prompt", "whitespace-chat", "no-messages", "empty-role",
         "id-eq-vocab", "id-over-int32", "long-request-id"],
)
def test_prompts(stack: Stack, req: pb.GenerateRequest, fragment: str) -> None:
    _expect(stack, req, INVALID, fragment)


# One row per bound, both sides where a side exists (docs/reliability.md #5 and #7).
SAMPLING_ROWS = [
    ("temperature", -1.0), ("temperature", math.nan), ("temperature", math.inf),
    ("top_p", 0.0), ("top_p", 1.5), ("top_p", -0.5),
    ("top_k", -2),
    ("min_p", 2.0), ("min_p", -0.1),
    ("repetition_penalty", 0.0), ("repetition_penalty", 2.5),
    ("frequency_penalty", -2.5), ("frequency_penalty", 2.5),
    ("presence_penalty", -2.5), ("presence_penalty", 2.5),
    ("max_new_tokens", 0),
    ("top_logprobs", 21),
    ("n", 0), ("n", 65), ("n", 10**6),
]


@pytest.mark.parametrize(("field", "value"), SAMPLING_ROWS,
                         ids=[f"{f}={v}" for f, v in SAMPLING_ROWS])
def test_sampling_bounds_name_the_field(stack: Stack, field: str, value: float) -> None:
    kw = {"max_new_tokens": 4, field: value}
    _expect(stack, request([5, 6], **kw), INVALID, field)


@pytest.mark.parametrize(
    ("kw", "fragment"),
    [
        ({"min_new_tokens": 9, "max_new_tokens": 4}, "min_new_tokens"),
        ({"stop": [""]}, "non-empty"),
        ({"stop": [f"s{i}" for i in range(17)]}, "stop strings"),
        ({"stop": ["x" * (1 << 20)]}, "stop strings must be at most"),
        ({"stop_token_ids": [VOCAB + 5]}, "stop_token_ids"),
        ({"stop_token_ids": list(range(65))}, "stop token ids"),
    ],
    ids=["min-over-max", "empty-stop", "too-many-stops", "1MiB-stop", "stop-token-vocab",
         "too-many-stop-tokens"],
)
def test_stopping_limits(stack: Stack, kw: dict, fragment: str) -> None:
    kw = {"max_new_tokens": 4, **kw}
    _expect(stack, request([5, 6], **kw), INVALID, fragment)
    _assert_serving(stack)


def test_explicit_zero_top_k_is_documented_disable(stack: Stack) -> None:
    res = collect(stack.stub, request([5, 6], max_new_tokens=2, top_k=0, seed=1))
    assert res.code == grpc.StatusCode.OK and len(res.token_ids) == 2


def test_duplicate_running_request_id(stack: Stack) -> None:
    call = stack.stub.Generate(request([5], max_new_tokens=500, ignore_eos=True, request_id="dup"))
    first = next(call)
    assert first.HasField("started")
    _expect(stack, request([5], max_new_tokens=1, request_id="dup"), INVALID, "already running")
    call.cancel()


def _raw(stack: Stack, payload: bytes, metadata: tuple = ()) -> grpc.StatusCode:
    generate = stack.channel.unary_stream("/radixserve.v1.GenerateService/Generate")
    try:
        for _ in generate(payload, timeout=10, metadata=metadata):
            pass
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def test_wire_abuse_gets_clean_status_and_server_survives(stack: Stack) -> None:
    valid = request("Hello", max_new_tokens=1).SerializeToString()
    # Bytes that do not parse are the client's mistake: INVALID_ARGUMENT, never INTERNAL.
    assert _raw(stack, random.Random(0).randbytes(256)) == INVALID
    assert _raw(stack, valid[: len(valid) // 2]) == INVALID
    bad_utf8 = b"\x12\x04ab\xff\xfe"  # field 2 (text), 4 bytes, not UTF-8
    assert _raw(stack, bad_utf8) == INVALID
    negative_id = b"\x1a\x0c\x0a\x0a" + b"\xff" * 9 + b"\x01"  # token_ids.ids = [-1] as varint
    assert _raw(stack, negative_id) == INVALID
    huge = request("x" * (5 << 20), max_new_tokens=1).SerializeToString()
    assert _raw(stack, huge) == grpc.StatusCode.RESOURCE_EXHAUSTED
    many_headers = tuple((f"h{i}", "v") for i in range(10_000))
    assert _raw(stack, valid, many_headers) != grpc.StatusCode.OK
    _assert_serving(stack)
