"""The compile limits of structured output (engine/constrained/compiler.py, workers.py): a text
over the size limit is refused before it compiles, a compile past the time limit is killed and
refused, and the compiler goes on serving other grammars meanwhile and afterwards.

The slow grammar is a JSON schema of objects nested 400 deep (36 KB): on the demo tokenizer it
takes 9-15 s to compile (docs/benchmarks.md, "Grammar compile times"), against limits of a
fraction of a second here, so no assertion depends on how loaded the machine is."""

from __future__ import annotations

import os
import threading

import pytest
from radixserve.bench.grammar import nested_objects
from radixserve.engine import InvalidRequestError, SamplingParams
from radixserve.engine.config import EngineConfig
from radixserve.engine.constrained.compiler import GrammarCompiler


def deep_schema() -> str:
    """Objects nested 400 deep (36 KB): 9-15 s to compile on the demo tokenizer."""
    return nested_objects(400)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def path(ckpt):
    return ckpt("demo")


def test_size_limit_counts_utf8_bytes_and_compiles_nothing(path):
    compiler = GrammarCompiler(str(path), 1024, (2,), max_bytes=100)
    try:
        assert compiler.compile("regex", "a" * 100).text == "a" * 100  # at the limit: fine
        with pytest.raises(InvalidRequestError) as err:
            compiler.compile("regex", "é" * 51)  # 51 characters, 102 bytes
        message = str(err.value)
        assert "regex is 102 bytes long; the limit is 100" in message
        assert "--max-constraint-bytes" in message
        assert compiler.cache_len() == 1
    finally:
        compiler.close()


def test_compile_past_the_time_limit_is_killed_and_others_go_on(path):
    compiler = GrammarCompiler(str(path), 1024, (2,), timeout_s=0.3)
    try:
        compiler.compile("regex", "[ab]{1,3}")  # one worker started and warm
        errors: list[InvalidRequestError] = []

        def slow() -> None:
            with pytest.raises(InvalidRequestError) as err:
                compiler.compile("json_schema", deep_schema())
            errors.append(err.value)

        thread = threading.Thread(target=slow)
        thread.start()
        # Meanwhile the other worker compiles new grammars.
        served = [compiler.compile("regex", f"(yes|no){{{k}}}") for k in range(1, 4)]
        thread.join(120)
        assert not thread.is_alive() and len(errors) == 1
        message = str(errors[0])
        assert "json_schema did not compile within the 0.3 s limit" in message
        assert "--grammar-compile-timeout" in message
        assert [g.text for g in served] == [f"(yes|no){{{k}}}" for k in range(1, 4)]
        assert compiler.workers.num_killed == 1
        assert len(compiler.workers.pids()) == 1  # the one that served meanwhile
        # The same text again is refused at once, without taking a worker.
        with pytest.raises(InvalidRequestError, match="did not compile within"):
            compiler.compile("json_schema", deep_schema())
        assert compiler.workers.num_killed == 1
        # The pool still serves two callers at once (the killed slot starts a fresh worker when
        # the compiles overlap).
        done = []
        pair = [threading.Thread(target=lambda k=k: done.append(compiler.compile("regex", f"c{k}")))
                for k in range(2)]
        for t in pair:
            t.start()
        for t in pair:
            t.join(120)
        assert sorted(g.text for g in done) == ["c0", "c1"]
        pids = compiler.workers.pids()
        assert 1 <= len(pids) <= 2
    finally:
        compiler.close()
    assert not any(alive(pid) for pid in pids)


def test_a_worker_that_dies_fails_its_compile_and_is_replaced(path):
    compiler = GrammarCompiler(str(path), 1024, (2,))
    try:
        compiler.compile("regex", "x+")
        [pid] = compiler.workers.pids()
        os.kill(pid, 9)
        with pytest.raises(RuntimeError, match="grammar compile worker failed"):
            compiler.compile("regex", "y+")
        assert compiler.compile("regex", "z+").text == "z+"
    finally:
        compiler.close()


def test_offline_engine_applies_its_configured_limits(path, make_llm):
    llm = make_llm(path, max_constraint_bytes=40000, grammar_compile_timeout_s=0.3)
    prompt = [11, 12, 13]
    with pytest.raises(InvalidRequestError, match="limit is 40000"):
        llm.generate([prompt], SamplingParams(regex="a" * 40001))
    with pytest.raises(InvalidRequestError, match="within the 0.3 s limit"):
        llm.generate([prompt, prompt],
                     [SamplingParams(), SamplingParams(json_schema=deep_schema())])
    assert not llm.core.has_work()  # all or nothing: the unconstrained one is gone too
    out = llm.generate([prompt], SamplingParams(regex="(yes|no)", max_new_tokens=8))[0]
    assert out.text in ("yes", "no")
    pids = llm.core._grammars.workers.pids()
    assert pids
    llm.close()
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("field,value", [("max_constraint_bytes", 0),
                                         ("max_constraint_bytes", (1 << 20) + 1),
                                         ("grammar_compile_timeout_s", 0.0),
                                         ("grammar_compile_timeout_s", float("inf"))])
def test_limits_are_validated(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(model_path="x", **{field: value})
