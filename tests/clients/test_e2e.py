"""End to end: grpc-shell and the Node client against a real `radixserve serve --model demo`.

The demo model has random weights, so these check the plumbing (exit codes, finish reasons, the
conversation reaching the radix cache), never the words.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from radixserve.client import Client, RadixServeError

from .test_client import free_port
from .test_node import NODE_DIR, ensure_node_modules
from .test_shell import SHELL, shell_env

RADIXSERVE = Path(sys.executable).with_name("radixserve")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not RADIXSERVE.exists(), reason="the radixserve server is not installed"),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    target = f"127.0.0.1:{free_port()}"
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(RADIXSERVE), "serve", "--model", "demo", "--port", target.rsplit(":", 1)[1]],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_ready(target, proc, log)
        yield target
    finally:
        proc.send_signal(signal.SIGTERM)  # the supervisor stops its children on SIGTERM
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_ready(target: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    # First use builds the demo model, so allow for that before the gateway answers.
    deadline = time.monotonic() + 300
    with Client(target) as client:
        while True:
            assert proc.poll() is None, f"serve exited early:\n{log.read_text()[-3000:]}"
            try:
                client.model_info(timeout=2)
                return
            except RadixServeError:
                assert time.monotonic() < deadline, f"not ready:\n{log.read_text()[-3000:]}"
                time.sleep(0.5)


def run_shell(
    tmp_path: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHELL, *args],
        input=stdin,
        env=shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_grpc_shell_one_shot_and_multi_turn(server: str, tmp_path: Path) -> None:
    one = run_shell(tmp_path, "--target", server, "--max-tokens", "8", "-c", "Hello")
    assert one.returncode == 0, one.stderr
    assert one.stdout.endswith("\n")

    # Two turns through piped stdin: the second resends the first, so its prompt hits the cache.
    system = "You are a helpful assistant who answers every question briefly and politely."
    args = ("--target", server, "--max-tokens", "8", "--system", system)
    two = run_shell(tmp_path, *args, stdin="Hello there\nTell me more\n")
    assert two.returncode == 0, two.stderr
    footers = re.findall(r"\[(\w+): (\d+) tokens, prompt (\d+) \((\d+) cached\)", two.stdout)
    assert len(footers) == 2, two.stdout
    (_, _, prompt1, _), (_, _, prompt2, cached2) = footers
    assert int(prompt2) > int(prompt1)
    assert int(cached2) > 0, "the second turn did not reuse the first turn's prefix"


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_client(server: str) -> None:
    ensure_node_modules()
    res = subprocess.run(
        ["node", str(NODE_DIR / "generate.js"), "--target", server, "--max-tokens", "8", "Hello"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert re.search(r"finish_reason: (length|eos|stop_token)", res.stderr), res.stderr
