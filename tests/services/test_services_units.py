"""Unit tests of the service cores, without gRPC: the engine loop, detokenizer state, tokenizer
jobs."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import grpc
import pytest
from radixserve.engine.sampling.params import SamplingParams
from radixserve.services.detokenizer.state import DetokenizerState, Output, Setup, Step
from radixserve.services.scheduler.loop import (
    AbortOwned,
    Acks,
    EngineLoop,
    LoopConfig,
    NewRequest,
    StepBatch,
    Submission,
)
from radixserve.services.tokenizer.core import (
    Decode,
    EncodeChat,
    EncodeText,
    JobFailure,
    TokenizerCore,
)
from svc_helpers import FakeEngine


class Sink:
    def __init__(self) -> None:
        self.acks: list[Acks] = []
        self.steps: list[StepBatch] = []
        self.ready = threading.Event()
        self.fatal: list[BaseException] = []
        self.stalls: list[bool] = []

    def on_ready(self, model_info: Any) -> None:
        self.ready.set()

    def on_acks(self, acks: Acks) -> None:
        self.acks.append(acks)

    def on_step(self, batch: StepBatch) -> None:
        self.steps.append(batch)

    def on_fatal(self, exc: BaseException) -> None:
        self.fatal.append(exc)

    def on_stalled(self, stalled: bool) -> None:
        self.stalls.append(stalled)


def new(rid: str, n: int = 3, **kw: Any) -> NewRequest:
    return NewRequest(rid, [5], SamplingParams(max_new_tokens=n, **kw), passthrough=rid)


def wait_for(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.005)


@pytest.fixture
def loop() -> Any:
    engine, sink = FakeEngine(step_delay_s=0.002), Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.02))
    lp.start()
    assert sink.ready.wait(5)
    yield lp, engine, sink
    lp.stop(5)
    assert not sink.fatal


def test_loop_one_message_per_step_with_setups_first(loop: Any) -> None:
    lp, engine, sink = loop
    lp.submit(Submission("gw", [new("a"), new("b")]))
    wait_for(lambda: lp.live_requests == 0 and len(engine.added) == 2 and not engine.reqs)
    first = sink.steps[0]
    assert [s.rid for s in first.setups] == ["a", "b"]
    assert {o.rid for o in first.outputs} == {"a", "b"}  # both in one message
    assert sink.acks[0] == Acks("gw", ["a", "b"], [])
    assert sum(len(s.outputs) for s in sink.steps) == 6
    assert lp.stats["running_requests"] == 0


def test_loop_add_and_abort_in_one_batch_never_announces(loop: Any) -> None:
    lp, engine, sink = loop
    lp.submit(Submission("gw", [new("x", 50)], abort_ids=["x"]))
    wait_for(lambda: "x" in engine.aborted)
    wait_for(lambda: sink.steps)
    assert all("x" not in [s.rid for s in step.setups] for step in sink.steps)
    assert sink.steps[-1].aborted == ["x"]
    assert lp.live_requests == 0


def test_loop_abort_owned_by_a_closed_stream(loop: Any) -> None:
    lp, engine, _ = loop
    lp.submit(Submission("g1", [new("a", 500), new("b", 500)]))
    lp.submit(Submission("g2", [new("c", 5)]))
    wait_for(lambda: len(engine.added) == 3)
    lp.submit(AbortOwned("g1"))
    wait_for(lambda: not engine.reqs)
    assert set(engine.aborted) == {"a", "b"} and lp.live_requests == 0


def test_loop_queue_limit_rejects_resource_exhausted() -> None:
    engine, sink = FakeEngine(), Sink()
    engine.stats = lambda: {"waiting_requests": 7}  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, max_waiting_requests=7))
    lp.start()
    lp.submit(Submission("gw", [new("a")]))
    wait_for(lambda: sink.acks)
    lp.stop(5)
    (rejection,) = sink.acks[0].rejected
    assert rejection.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_loop_group_is_added_whole_or_refused_whole() -> None:
    """The n completions of a request (one group) never half-admit: a group that does not fit the
    queue takes its added members back out, and each member hears the same status."""
    engine, sink = FakeEngine(step_delay_s=0.05), Sink()
    engine.stats = lambda: {"waiting_requests": len(engine.reqs), "running_requests": 0}  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, max_waiting_requests=2))
    lp.start()
    group = [dataclasses.replace(new(f"g{i}", 50), group="g") for i in range(3)]
    lp.submit(Submission("gw", group))
    wait_for(lambda: sink.acks)
    assert sink.acks[0].accepted == []
    assert [(r.rid, r.code) for r in sink.acks[0].rejected] == [
        (f"g{i}", grpc.StatusCode.RESOURCE_EXHAUSTED) for i in range(3)]
    assert engine.added == ["g0", "g1"] and sorted(engine.aborted) == ["g0", "g1"]
    assert not engine.reqs and lp.live_requests == 0
    assert all(not step.setups for step in sink.steps)  # the detokenizer never heard of them
    # Two fit: the whole group runs. Ungrouped, three requests would half-admit instead.
    lp.submit(Submission("gw", [dataclasses.replace(new(f"h{i}", 2), group="h") for i in range(2)]))
    wait_for(lambda: len(sink.acks) == 2)
    assert sink.acks[1].accepted == ["h0", "h1"] and not sink.acks[1].rejected
    wait_for(lambda: not engine.reqs)
    lp.submit(Submission("gw", [new(f"u{i}", 50) for i in range(3)]))
    wait_for(lambda: len(sink.acks) == 3)
    assert sink.acks[2].accepted == ["u0", "u1"] and [r.rid for r in sink.acks[2].rejected] == ["u2"]
    lp.stop(5)


def test_scheduler_refuses_a_group_whole_when_one_member_is_refused() -> None:
    from radixserve.internal.scheduler.v1 import scheduler_pb2 as pb
    from radixserve.services.gateway import convert as gateway_convert
    from radixserve.services.scheduler import convert
    from radixserve.services.scheduler.server import _rejection, _without_refused_groups

    params = SamplingParams(max_new_tokens=4)
    msg = pb.SubmitRequest(requests=[
        gateway_convert.new_request_to_pb(rid, [5], params, True, group)
        for rid, group in (("a0", "a"), ("a1", "a"), ("b0", "b"), ("c", ""))
    ])
    taken = [convert.new_request_from_pb(m) for m in msg.requests if m.request_id != "a0"]
    rejected = [_rejection("a0", grpc.StatusCode.INVALID_ARGUMENT, "bad temperature")]
    kept = _without_refused_groups(msg, taken, rejected)
    assert [r.rid for r in kept] == ["b0", "c"]
    assert [(r.request_id, r.status.message) for r in rejected] == [
        ("a0", "bad temperature"), ("a1", "bad temperature")]


def test_loop_engine_crash_is_fatal() -> None:
    engine, sink = FakeEngine(), Sink()
    engine.step = lambda: 1 / 0  # type: ignore[method-assign]
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False))
    lp.start()
    lp.submit(Submission("gw", [new("a")]))
    wait_for(lambda: sink.fatal)
    assert isinstance(sink.fatal[0], ZeroDivisionError)


@pytest.mark.parametrize("spec", ["raise:2", "hang:2"])
def test_loop_injected_fault_is_fatal(spec: str, capfd: pytest.CaptureFixture[str]) -> None:
    from radixserve.services.scheduler import faults
    from radixserve.services.scheduler.loop import WatchdogTimeout

    sink = Sink()
    factory = faults.wrap_factory(FakeEngine, spec)
    lp = EngineLoop(factory, sink, LoopConfig(warmup=False, idle_poll_s=0.05, watchdog_s=0.5,
                                              watchdog_exit_grace_s=60))
    lp.start()
    lp.submit(Submission("gw", [new("a", 10)]))
    wait_for(lambda: sink.fatal)
    expected = faults.InjectedFault if spec.startswith("raise") else WatchdogTimeout
    assert isinstance(sink.fatal[0], expected) and len(sink.fatal) == 1
    if expected is WatchdogTimeout:
        assert sink.stalls[:1] == [True]  # readiness dropped before the watchdog fired
        import faulthandler

        faulthandler.cancel_dump_traceback_later()  # this process is the test runner
        assert "most recent call first" in capfd.readouterr().err
    lp.stop(0.1)


def test_fault_armed_by_a_trigger_file_breaks_the_next_step(tmp_path: Any) -> None:
    from radixserve.services.scheduler import faults

    trigger = tmp_path / "fault"
    assert faults.parse(f"raise:@{trigger}") == ("raise", str(trigger))
    for bad in ("raise:", "raise:@", "boom:3", "hang:x"):
        with pytest.raises(ValueError, match="KIND:N or KIND:@PATH"):
            faults.parse(bad)
    engine = faults.wrap_factory(FakeEngine, f"raise:@{trigger}")()
    engine.add_request("a", [5], SamplingParams(max_new_tokens=100))
    for _ in range(5):  # no step count arms it: the file does
        engine.step()
    trigger.touch()
    with pytest.raises(faults.InjectedFault):
        engine.step()


def test_loop_watchdog_quiet_when_idle_or_slow_but_moving() -> None:
    sink = Sink()
    lp = EngineLoop(lambda: FakeEngine(step_delay_s=0.1), sink,
                    LoopConfig(warmup=False, idle_poll_s=0.05, watchdog_s=0.4))
    lp.start()
    time.sleep(0.6)  # idle
    lp.submit(Submission("gw", [new("a", 8)]))  # 8 steps of 0.1 s: 0.8 s busy, each step short
    time.sleep(1.2)
    assert not sink.fatal and not sink.stalls
    lp.stop(1)


@pytest.fixture(scope="module")
def hf_tokenizer(demo_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(demo_path)


def test_detokenizer_state_lifetimes(hf_tokenizer: Any) -> None:
    from radixserve.engine.detokenize import IncrementalDetokenizer

    state = DetokenizerState(lambda s: IncrementalDetokenizer(
        hf_tokenizer, s.prompt_ids, s.stop, s.include_stop_str, s.skip_special_tokens))
    ids = hf_tokenizer.encode(" one two three four")
    r = state.apply(Step(setups=[Setup("a", [1]), Setup("b", [1], stop=(" three",))],
                         outputs=[Output("a", ids[:2]), Output("b", ids[:2])]))
    assert [d.text for d in r.deltas] == [" one two", " one two"] and not r.abort_ids
    r = state.apply(Step(outputs=[Output("b", ids[2:]), Output("a", ids[2:], "length",
                                                                 prompt_tokens=1)]))
    by_rid = {d.rid: d for d in r.deltas}
    assert by_rid["b"].finish is not None and by_rid["b"].finish.reason == "stop_string"
    assert by_rid["b"].finish.stop_string == " three" and by_rid["b"].text == ""
    assert r.abort_ids == ["b"]  # the engine must stop generating it
    assert by_rid["a"].text == " three four" and by_rid["a"].finish.completion_tokens == len(ids)
    assert len(state) == 0
    # Late output of a finished request, abort of an unknown one: ignored, nothing held.
    r = state.apply(Step(aborted=["zzz"], outputs=[Output("b", ids[:1])]))
    assert r.deltas == [] and len(state) == 0
    state.apply(Step(setups=[Setup("c", [1])]))
    state.apply(Step(aborted=["c"]))
    assert len(state) == 0
    state.apply(Step(setups=[Setup("d", [1])]))
    state.reset()
    assert len(state) == 0


class _PoisonTemplate:
    """A tokenizer whose chat template raises the way a template's raise_exception does."""

    chat_template = "{{ raise_exception('bad role') }}"
    all_special_ids = (0,)

    def __len__(self) -> int:
        return 10

    def apply_chat_template(self, *a: Any, **kw: Any) -> str:
        import jinja2

        raise jinja2.TemplateError("bad role")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if text == "boom":
            raise RuntimeError("tokenizer bug")
        return [1, 2]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "ab"


def test_tokenizer_poison_fails_only_its_job() -> None:
    core = TokenizerCore(_PoisonTemplate())
    out = core.run_batch([EncodeChat((("user", "x"),)), EncodeText("boom"), EncodeText("ok"),
                          Decode((1, 99))])
    assert isinstance(out[0], JobFailure) and out[0].code == grpc.StatusCode.INVALID_ARGUMENT
    assert isinstance(out[1], JobFailure) and out[1].code == grpc.StatusCode.INTERNAL
    assert out[2] == [1, 2]
    assert isinstance(out[3], JobFailure) and "outside the vocabulary" in out[3].message


def test_cli_engine_flags_round_trip_to_the_scheduler_child() -> None:
    from radixserve.services.cli import _engine_config, build_parser, engine_argv

    args = build_parser().parse_args(
        ["serve", "--no-overlap", "--cache", "naive", "--page-size", "8", "--num-pages", "64"])
    engine = _engine_config(args, "/models/x")
    child = build_parser().parse_args(["scheduler", *engine_argv(engine)])
    assert _engine_config(child, "/models/x") == engine
    assert not engine.overlap and engine.cache == "naive" and engine.num_pages == 64


def test_loop_abort_frees_before_the_next_step_and_shows_it() -> None:
    """RELIABILITY "Abort latency": an abort that reaches the loop while a step runs frees the
    request before the step after it, and the stats snapshot (what `bench abort` reads through
    the metrics) shows the freed slot at once, with the step count."""
    engine = FakeEngine(step_delay_s=0.2)
    sink = Sink()
    lp = EngineLoop(lambda: engine, sink, LoopConfig(warmup=False, idle_poll_s=0.05))
    lp.start()
    try:
        lp.submit(Submission("gw", [new("a", 1000), new("b", 1000)]))
        wait_for(lambda: lp.stats.get("running_requests") == 2)
        steps = lp.stats["engine_steps_total"]
        t0 = time.monotonic()
        lp.submit(Submission("gw", abort_ids=["a"]))
        wait_for(lambda: lp.stats.get("running_requests") == 1)
        # Only the step in progress ran in between: freed before the next one, and shown then
        # (a snapshot taken after that next step would say 2).
        assert lp.stats["engine_steps_total"] - steps <= 1
        assert engine.abort_steps["a"] - steps <= 1
        assert time.monotonic() - t0 < 2.0  # one 0.2 s step, with room for a loaded machine
    finally:
        lp.stop(1.0)


def test_gateway_joins_the_deltas_a_slow_stream_left_queued() -> None:
    """Deltas that piled up while a stream's writes lagged go out as one message, in order, with
    nothing lost; a non-delta item (an abort, a failure) is never merged or reordered."""
    from radixserve.internal.detokenizer.v1 import detokenizer_pb2 as detok_pb
    from radixserve.services.gateway.inbox import Aborted, coalesce

    def delta(ids: list[int], text: str, finish: bool = False) -> Any:
        d = detok_pb.RequestDelta(request_id="r", token_ids=ids, text=text,
                                  logprobs=[detok_pb.TokenLogprobs(logprob=-float(i)) for i in ids])
        if finish:
            d.finish.completion_tokens = 5
        return d

    aborted = Aborted()
    out = coalesce([delta([1], "a"), delta([2, 3], "bc"), aborted, delta([4], "d"),
                    delta([5], "é", finish=True), delta([6], "x")])
    assert len(out) == 4 and out[1] is aborted
    first, last = out[0], out[2]
    assert list(first.token_ids) == [1, 2, 3] and first.text == "abc" and not first.HasField("finish")
    assert [lp.logprob for lp in first.logprobs] == [-1.0, -2.0, -3.0]
    assert list(last.token_ids) == [4, 5] and last.text == "dé" and last.finish.completion_tokens == 5
    assert list(out[3].token_ids) == [6]  # nothing joins a delta after a finish


def test_liveness_judges_silence_from_the_first_answer() -> None:
    """A child not listening yet is starting, not hung; one that answered and then went quiet
    for the timeout is named, whatever phase the supervisor is in."""
    from concurrent import futures

    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from radixserve.services.supervisor import Child, Liveness

    quiet = threading.Event()

    class Health(health_pb2_grpc.HealthServicer):
        def Check(self, request: Any, context: Any) -> Any:
            if quiet.is_set():
                time.sleep(5)  # like a process whose GIL is held: no answer in time
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)

    server = grpc.server(futures.ThreadPoolExecutor(4))
    health_pb2_grpc.add_HealthServicer_to_server(Health(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    children = [Child("up", [], f"127.0.0.1:{port}"), Child("starting", [], "unix:/nonexistent.sock")]
    liveness = Liveness(children, timeout_s=0.8)
    try:
        deadline = time.monotonic() + 1.6
        while time.monotonic() < deadline:  # both quiet past the timeout: "starting" never answered
            assert liveness.silent() is None
            time.sleep(0.05)
        quiet.set()
        t0 = time.monotonic()
        while liveness.silent() != "up":
            assert time.monotonic() - t0 < 3.0, "a silent child was never named"
            time.sleep(0.05)
        assert time.monotonic() - t0 > 0.5  # named after the timeout, not at the first late probe
    finally:
        liveness.close()
        server.stop(0)


def test_liveness_hears_a_slow_starter_within_two_seconds(tmp_path: Any) -> None:
    """A child that listens 12 s after spawn is answered within ~2 s of it, not after grpc's
    default reconnect backoff (which grows towards 120 s); until then a hang would go unseen."""
    from concurrent import futures

    from grpc_health.v1 import health, health_pb2_grpc
    from radixserve.services.supervisor import Child, Liveness

    sock = tmp_path / "child.sock"
    liveness = Liveness([Child("slow", [], f"unix:{sock}")], timeout_s=3.0)
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
    try:
        deadline = time.monotonic() + 12.0
        while time.monotonic() < deadline:
            assert liveness.silent() is None  # not listening yet: starting, not hung
            time.sleep(0.05)
        server.add_insecure_port(f"unix:{sock}")
        server.start()
        up = time.monotonic()
        while liveness._answered["slow"] is None:
            assert time.monotonic() - up < 2.5, "the first answer came too late"
            liveness.silent()
            time.sleep(0.05)
    finally:
        liveness.close()
        server.stop(0)
