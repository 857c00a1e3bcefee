"""Structured output end to end through the real four-process stack on the demo model: the
constraint travels gateway -> scheduler, compiles on the scheduler's workers, and the engine's
output is in the constrained language. The demo model's weights are tiny and untrained for JSON,
so the schemas and regexes have bounded languages and the requests get room to finish."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import grpc
import jsonschema
from radixserve.v1 import generate_pb2 as pb
from svc_helpers import Stack, collect, request

SCHEMA = {
    "type": "object",
    "properties": {
        "color": {"enum": ["red", "green", "blue"]},
        "size": {"type": "integer", "minimum": 0, "maximum": 99},
        "tag": {"type": "string", "pattern": "^[a-z]{1,6}$"},
        "ok": {"type": "boolean"},
    },
    "required": ["color", "size", "tag", "ok"],
    "additionalProperties": False,
}
REGEX = r"(yes|no|maybe)-[0-9]{1,3}(\.[a-z]{1,4})?"
EBNF = 'root ::= "(" item ("," item){0,3} ")"\nitem ::= "a" | "bb" | [0-9]'
PROMPTS = ["Hello world", "The quick brown fox", "Once upon a time, in a land"]


def _finished_complete(res) -> None:  # noqa: ANN001 - svc_helpers.StreamResult
    assert res.code == grpc.StatusCode.OK, res.details
    # Complete (the grammar accepted it and the model ended) rather than cut by max_new_tokens.
    assert res.finished.finish_reason == pb.FINISH_REASON_EOS, res.text


def test_json_schema_output_parses_and_validates(stack: Stack) -> None:
    reqs = [request(p, max_new_tokens=200, seed=s, json_schema=json.dumps(SCHEMA))
            for s, p in enumerate(PROMPTS)]
    reqs.append(request(PROMPTS[0], max_new_tokens=200, temperature=0.0,
                        json_schema=json.dumps(SCHEMA)))
    with ThreadPoolExecutor(len(reqs)) as pool:
        results = list(pool.map(lambda r: collect(stack.stub, r), reqs))
    for res in results:
        _finished_complete(res)
        jsonschema.validate(json.loads(res.text), SCHEMA)


def test_regex_and_ebnf_outputs_fully_match(stack: Stack) -> None:
    reqs = [request(p, max_new_tokens=64, seed=s, temperature=0.8, regex=REGEX)
            for s, p in enumerate(PROMPTS)]
    reqs += [request(p, max_new_tokens=64, seed=s, ebnf=EBNF) for s, p in enumerate(PROMPTS)]
    with ThreadPoolExecutor(len(reqs)) as pool:
        results = list(pool.map(lambda r: collect(stack.stub, r), reqs))
    for res in results[:3]:
        _finished_complete(res)
        assert re.fullmatch(REGEX, res.text), res.text
    for res in results[3:]:
        _finished_complete(res)
        assert re.fullmatch(r"\((a|bb|[0-9])(,(a|bb|[0-9])){0,3}\)", res.text), res.text


def test_n_constrained_completions_each_validate(stack: Stack) -> None:
    res = collect(stack.stub, request(PROMPTS[1], max_new_tokens=200, n=3, seed=7,
                                      json_schema=json.dumps(SCHEMA)))
    assert res.code == grpc.StatusCode.OK, res.details
    texts = {i: "" for i in range(3)}
    for r in res.responses:
        if r.HasField("delta"):
            texts[r.index] += r.delta.text
    finished = [r.finished for r in res.responses if r.HasField("finished")]
    assert [f.finish_reason for f in finished] == [pb.FINISH_REASON_EOS] * 3
    for text in texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_bad_grammar_is_invalid_argument_and_the_stack_keeps_serving(stack: Stack) -> None:
    bad = [request(PROMPTS[0], json_schema='{"type": "object", "properties": '),
           request(PROMPTS[0], regex="(unclosed"),
           request(PROMPTS[0], ebnf='root ::= missing_rule'),
           request(PROMPTS[0], n=3, seed=1, regex="[z-a]")]
    with ThreadPoolExecutor(len(bad) + 2) as pool:
        ok = [pool.submit(collect, stack.stub, request(p, max_new_tokens=8)) for p in PROMPTS[:2]]
        results = list(pool.map(lambda r: collect(stack.stub, r), bad))
        for fut in ok:
            assert fut.result().code == grpc.StatusCode.OK
    for res, kind in zip(results, ["json_schema", "regex", "ebnf", "regex"]):
        assert res.code == grpc.StatusCode.INVALID_ARGUMENT, res.details
        assert res.details.startswith(f"{kind} does not compile: "), res.details
        assert len(res.details) > len(f"{kind} does not compile: ") and res.responses == []
    after = collect(stack.stub, request(PROMPTS[2], max_new_tokens=32, regex=REGEX))
    _finished_complete(after)
    assert re.fullmatch(REGEX, after.text)


def test_too_long_constraint_is_invalid_argument_naming_the_field(stack: Stack) -> None:
    res = collect(stack.stub, request(PROMPTS[0], regex="a" * 70000))
    assert res.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "regex" in res.details and "65536" in res.details
