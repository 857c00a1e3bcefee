"""Wait until a radixserve gateway at TARGET reports SERVING on grpc.health.v1, then have it answer
one Generate and one regex-constrained Generate with the Python client. With --replicas N, also
wait until GetServerInfo shows N scheduler replicas serving, and send distinct prompts until each
has been routed one. Used by docker/smoke.sh; exits non-zero with a reason.

    python docker/smoke_generate.py 127.0.0.1:50051 --deadline 300 [--replicas 2]
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.client import Client
from radixserve.v1 import generate_pb2 as pb
from radixserve.v1 import generate_pb2_grpc as pb_grpc

# Prompts with nothing in common, which the cache-aware router spreads by load.
PROMPTS = ("Tell me a story", "Why is the sky blue?", "Count to ten", "Zebra crossing",
           "Quiet house in the hills", "A recipe for bread", "Seven rivers", "Orange lanterns")


def wait_serving(target: str, deadline: float) -> None:
    last = "no answer yet"
    with grpc.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                status = stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status
                if status == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
            except grpc.RpcError as err:
                last = f"{err.code().name}: {err.details()}"
            time.sleep(1)
    raise SystemExit(f"{target} not SERVING before the deadline (last: {last})")


def replicas(target: str) -> list[pb.ReplicaInfo]:
    with grpc.insecure_channel(target) as channel:
        info = pb_grpc.GenerateServiceStub(channel).GetServerInfo(pb.GetServerInfoRequest(),
                                                                  timeout=10)
    return list(info.replicas)


def check_replicas(target: str, want: int, deadline: float) -> None:
    """`want` replicas serving, and each answering a request routed to it."""
    while True:
        states = [pb.ReplicaState.Name(r.state) for r in replicas(target)]
        if states == ["REPLICA_STATE_SERVING"] * want:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"{target}: replicas {states}, not {want} serving")
        time.sleep(1)
    with Client(target) as client:
        for prompt in PROMPTS:
            if min(r.routed_requests for r in replicas(target)) > 0:
                break
            client.generate_text(prompt, max_new_tokens=4, timeout=120)
    served = {r.address: r.routed_requests for r in replicas(target)}
    if min(served.values()) == 0:
        raise SystemExit(f"{target}: a replica got no request: {served}")
    print(f"{target}: replicas serving: {want}, requests routed: {served}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--deadline", type=float, default=300, help="seconds to wait for SERVING")
    parser.add_argument("--prompt", default="Hello")
    parser.add_argument("--replicas", type=int, default=0,
                        help="scheduler replicas that must serve (0: do not check)")
    args = parser.parse_args()
    start = time.monotonic()
    wait_serving(args.target, start + args.deadline)
    print(f"{args.target}: SERVING after {time.monotonic() - start:.1f} s", flush=True)
    with Client(args.target) as client:
        result = client.generate_text(args.prompt, max_new_tokens=16, timeout=120)
    if not result.token_ids:
        raise SystemExit(f"{args.target}: Generate returned no tokens ({result.finish_reason})")
    print(f"{args.target}: Generate {args.prompt!r} -> {result.text!r} "
          f"({len(result.token_ids)} tokens, {result.finish_reason})")
    # Structured output: the image's grammar compiler works (the CPU image carries no Triton).
    regex = "(yes|no), (red|green|blue)"
    with Client(args.target) as client:
        answer = client.generate_text(args.prompt, max_new_tokens=32, regex=regex, timeout=120)
    if not re.fullmatch(regex, answer.text) or answer.finish_reason == "length":
        raise SystemExit(f"{args.target}: constrained Generate gave {answer.text!r} "
                         f"({answer.finish_reason})")
    print(f"{args.target}: Generate under regex {regex!r} -> {answer.text!r}")
    if args.replicas:
        check_replicas(args.target, args.replicas, start + args.deadline)
    return 0


if __name__ == "__main__":
    sys.exit(main())
