"""Wait until a radixserve gateway at TARGET reports SERVING on grpc.health.v1, then have it answer
one Generate and one regex-constrained Generate with the Python client. Used by docker/smoke.sh;
exits non-zero with a reason.

    python docker/smoke_generate.py 127.0.0.1:50051 --deadline 300
"""

from __future__ import annotations

import argparse
import re
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from radixserve.client import Client


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--deadline", type=float, default=300, help="seconds to wait for SERVING")
    parser.add_argument("--prompt", default="Hello")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
