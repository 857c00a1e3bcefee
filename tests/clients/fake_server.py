"""A scripted in-process GenerateService, the server-side test double for client tests.

It records every request, its metadata, and whether the client cancelled it, and answers by
what the last user text says:
  "long ..."        streams "tick " until the client cancels (capped at 60 s)
  "error:<CODE> m"  ends the RPC with that status code and message m
  anything else     replies "echo: <text>", one character per token, then finishes
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field

import grpc
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc


@dataclass
class Seen:
    request: pb.GenerateRequest
    metadata: dict[str, str]
    peer: str  # the client's address and port: one per connection
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)


def last_text(req: pb.GenerateRequest) -> str:
    kind = req.WhichOneof("prompt")
    if kind == "text":
        return req.text.rsplit("user: ", 1)[-1].removesuffix("\nassistant:")
    if kind == "chat":
        return req.chat.messages[-1].content if req.chat.messages else ""
    return "".join(chr(i) for i in req.token_ids.ids)


class FakeGenerateService(pb_grpc.GenerateServiceServicer):
    def __init__(self, *, has_chat_template: bool = True, token_delay: float = 0.005) -> None:
        self.seen: list[Seen] = []
        self.aborted: list[str] = []
        self.abort_peers: list[str] = []
        self.has_chat_template = has_chat_template
        self.token_delay = token_delay
        self._lock = threading.Lock()

    def wait_for(self, n: int, timeout: float = 10.0) -> Seen:
        """The n-th (1-based) Generate call, once it has reached the server."""
        deadline = time.monotonic() + timeout
        while len(self.seen) < n:
            assert time.monotonic() < deadline, f"only {len(self.seen)} of {n} requests arrived"
            time.sleep(0.01)
        return self.seen[n - 1]

    def Generate(
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        seen = Seen(request, {k: str(v) for k, v in context.invocation_metadata()},
                    context.peer())
        with self._lock:
            self.seen.append(seen)
            rid = request.request_id or f"fake-{len(self.seen)}"

        def on_rpc_done() -> None:
            # Runs on any termination; only a cancelled RPC ends while still active.
            if not seen.done.is_set():
                seen.cancelled.set()

        context.add_callback(on_rpc_done)
        text = last_text(request)
        if text.startswith("error:"):
            code, _, message = text.removeprefix("error:").partition(" ")
            seen.done.set()
            context.abort(grpc.StatusCode[code], message or "fake error")
        prompt_len = len(text)
        yield pb.GenerateResponse(request_id=rid, started=pb.Started(prompt_tokens=prompt_len))
        if text.startswith("long"):
            deadline = time.monotonic() + 60
            while context.is_active() and time.monotonic() < deadline:
                yield self._delta(rid, "tick ", request)
                time.sleep(0.02)
            return
        reply = f"echo: {text}"
        stopping = request.stopping
        limit = stopping.max_new_tokens if stopping.HasField("max_new_tokens") else len(reply)
        emitted = reply[:limit]
        for ch in emitted:
            yield self._delta(rid, ch, request)
            time.sleep(self.token_delay)
        reason = pb.FINISH_REASON_LENGTH if len(emitted) < len(reply) else pb.FINISH_REASON_EOS
        seen.done.set()
        yield pb.GenerateResponse(
            request_id=rid,
            finished=pb.Finished(
                finish_reason=reason,
                usage=pb.Usage(
                    prompt_tokens=prompt_len, completion_tokens=len(emitted), cached_tokens=3
                ),
                timings=pb.Timings(
                    queue_seconds=0.001, time_to_first_token_seconds=0.01, total_seconds=0.05
                ),
            ),
        )

    @staticmethod
    def _delta(rid: str, text: str, request: pb.GenerateRequest) -> pb.GenerateResponse:
        ids = [ord(c) for c in text]
        opts = request.options
        lps = []
        if opts.logprobs or opts.top_logprobs:
            top = [
                pb.TopLogprob(token_id=i, logprob=-0.5 * (i + 1)) for i in range(opts.top_logprobs)
            ]
            lps = [pb.TokenLogprobs(logprob=-0.25, top=top) for _ in ids]
        return pb.GenerateResponse(
            request_id=rid, delta=pb.Delta(token_ids=ids, text=text, logprobs=lps)
        )

    def Tokenize(
        self, request: pb.TokenizeRequest, context: grpc.ServicerContext
    ) -> pb.TokenizeResponse:
        if request.WhichOneof("input") == "chat":
            text = "".join(f"<{m.role}>{m.content}" for m in request.chat.messages)
        else:
            text = request.text
        bos = (
            [1] if request.add_special_tokens or not request.HasField("add_special_tokens") else []
        )
        return pb.TokenizeResponse(token_ids=bos + [ord(c) for c in text])

    def Detokenize(
        self, request: pb.DetokenizeRequest, context: grpc.ServicerContext
    ) -> pb.DetokenizeResponse:
        return pb.DetokenizeResponse(text="".join(chr(i) for i in request.token_ids))

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortResponse:
        self.aborted.extend(request.request_ids)
        self.abort_peers.append(context.peer())
        return pb.AbortResponse(aborted=len(request.request_ids))

    def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return pb.GetModelInfoResponse(
            model_name="fake-model",
            max_context=4096,
            vocab_size=1000,
            eos_token_ids=[2],
            has_chat_template=self.has_chat_template,
            architecture="FakeForCausalLM",
            dtype="float32",
        )

    def GetServerInfo(
        self, request: pb.GetServerInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetServerInfoResponse:
        return pb.GetServerInfoResponse(
            version="0.0-fake",
            running_requests=1,
            waiting_requests=2,
            kv_pages_total=100,
            kv_pages_free=60,
            kv_pages_evictable=30,
            kv_pages_protected=10,
            page_size=16,
            prefix_cache_hit_rate=0.25,
            cached_tokens_total=250,
            prompt_tokens_total=1000,
        )


@contextmanager
def serve(fake: FakeGenerateService) -> Iterator[str]:
    """Serve `fake` on a free loopback port; yields the target "127.0.0.1:PORT"."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_GenerateServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)
