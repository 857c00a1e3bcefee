"""The Node.js client (clients/node) against the fake GenerateService."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .fake_server import FakeGenerateService

NODE_DIR = Path(__file__).resolve().parents[2] / "clients" / "node"
NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed")


def ensure_node_modules() -> None:
    """A fresh clone has no node_modules: install the locked versions."""
    if not (NODE_DIR / "node_modules" / "@grpc" / "grpc-js").exists():
        npm = shutil.which("npm")
        assert npm, "node is installed but npm is not"
        subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True, timeout=300
        )


@pytest.fixture(scope="module", autouse=True)
def node_modules() -> None:
    ensure_node_modules()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(NODE), str(NODE_DIR / "generate.js"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_cli_streams_text_and_finish_reason(fake: FakeGenerateService, target: str) -> None:
    res = cli("--target", target, "hello")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "echo: hello\n"
    assert "finish_reason: eos" in res.stderr
    req = fake.seen[0].request
    assert req.text == "hello"
    assert not req.HasField("sampling") and not req.stopping.HasField("max_new_tokens")


def test_cli_options_reach_the_wire(fake: FakeGenerateService, target: str) -> None:
    args = ("--target", target, "--api-key", "nk", "--max-tokens", "4", "--temperature", "0")
    res = cli(*args, "--chat", "hey there")
    assert res.returncode == 0, res.stderr
    assert res.stdout == "echo\n" and "finish_reason: length" in res.stderr
    seen = fake.seen[0]
    assert seen.request.sampling.HasField("temperature") and seen.request.sampling.temperature == 0
    assert not seen.request.sampling.HasField("top_p")
    assert seen.request.stopping.max_new_tokens == 4
    assert [(m.role, m.content) for m in seen.request.chat.messages] == [("user", "hey there")]
    assert seen.metadata["authorization"] == "Bearer nk"


def test_cli_errors(target: str) -> None:
    res = cli("--target", target, "error:INVALID_ARGUMENT token id outside the vocabulary")
    assert res.returncode == 1
    assert "INVALID_ARGUMENT: token id outside the vocabulary" in res.stderr
    from .test_client import free_port

    res = cli("--target", f"127.0.0.1:{free_port()}", "hi")
    assert res.returncode == 1 and "UNAVAILABLE" in res.stderr


def test_cli_ctrl_c_cancels_the_rpc(fake: FakeGenerateService, target: str) -> None:
    proc = subprocess.Popen(
        [str(NODE), str(NODE_DIR / "generate.js"), "--target", target, "long"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.read(5) == b"tick "  # streamed before the reply is done
        assert not fake.seen[0].cancelled.is_set()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 130
        assert fake.seen[0].cancelled.wait(5)
    finally:
        proc.kill()
        proc.wait()


LIBRARY_SCRIPT = """
const { GenerateClient } = require(process.argv[1]);
(async () => {
  const c = new GenerateClient(process.argv[2]);
  const out = {};
  out.text = await c.generateText('abc', { temperature: 0, topK: 0, seed: 0 });
  out.tokens = await c.generateText({ tokenIds: [104, 105] }, { maxNewTokens: 3, n: 1 });
  try { await c.generateText('ab', { n: 2 }); } catch (err) { out.refusedN = err.name; }
  out.indexes = [];
  for await (const ev of c.generate('ab', { n: 1 })) {
    if (ev.type !== 'started') out.indexes.push(ev.index);
  }
  let n = 0;
  for await (const ev of c.generate('long')) { if (ev.type === 'delta' && ++n === 3) break; }
  out.broke = n;
  try { await c.generateText('error:RESOURCE_EXHAUSTED queue full'); }
  catch (err) {
    out.error = { name: err.name, code: err.code, codeName: err.codeName, details: err.details };
  }
  out.tokenize = await c.tokenize('ab');
  out.detokenize = await c.detokenize([104, 105]);
  out.aborted = await c.abort(['x', 'y']);
  out.model = (await c.modelInfo()).model_name;
  out.running = (await c.serverInfo()).running_requests;
  console.log(JSON.stringify(out));
  // Keep the channel open until the test closes stdin, so only the break can have cancelled.
  await new Promise((resolve) => { process.stdin.on('end', resolve); process.stdin.resume(); });
  c.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_library(fake: FakeGenerateService, target: str) -> None:
    proc = subprocess.Popen(
        [str(NODE), "-e", LIBRARY_SCRIPT, str(NODE_DIR / "index.js"), target],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    assert fake.wait_for(4).cancelled.wait(5)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    out = json.loads(line)
    assert out["text"]["text"] == "echo: abc" and out["text"]["finishReason"] == "eos"
    assert out["text"]["usage"]["completion_tokens"] == 9 and out["text"]["requestId"] == "fake-1"
    assert out["tokens"]["text"] == "ech" and out["tokens"]["finishReason"] == "length"
    assert out["tokens"]["tokenIds"] == [101, 99, 104]
    assert out["broke"] == 3
    assert fake.seen[1].request.sampling.HasField("n") and fake.seen[1].request.sampling.n == 1
    assert out["indexes"] and set(out["indexes"]) == {0}
    assert out["refusedN"] == "RangeError"
    assert out["error"] == {
        "name": "RadixServeError",
        "code": 8,
        "codeName": "RESOURCE_EXHAUSTED",
        "details": "queue full",
    }
    assert out["tokenize"] == [1, 97, 98] and out["detokenize"] == "hi" and out["aborted"] == 2
    assert out["model"] == "fake-model" and out["running"] == 1
    s = fake.seen[0].request.sampling
    assert all(s.HasField(f) for f in ("temperature", "top_k", "seed"))
    assert (s.temperature, s.top_k, s.seed) == (0, 0, 0) and not s.HasField("top_p")
    assert list(fake.seen[1].request.token_ids.ids) == [104, 105]


CONSTRAINT_SCRIPT = """
const { GenerateClient } = require(process.argv[1]);
(async () => {
  const c = new GenerateClient(process.argv[2]);
  await c.generateText('a', { jsonSchema: { type: 'integer' } });
  await c.generateText('b', { regex: '[ab]{1,3}', temperature: 0 });
  await c.generateText('c', { ebnf: 'root ::= "x"' });
  await c.generateText('d', { jsonSchema: '{"type": "string"}' });
  let refused = null;
  try { await c.generateText('e', { regex: 'a', ebnf: 'root ::= "a"' }); }
  catch (err) { refused = err.name; }
  console.log(JSON.stringify({ refused }));
  c.close();
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_library_constraints(fake: FakeGenerateService, target: str) -> None:
    res = subprocess.run(
        [str(NODE), "-e", CONSTRAINT_SCRIPT, str(NODE_DIR / "index.js"), target],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == {"refused": "TypeError"}
    got = [(s.request.sampling.WhichOneof("constraint"), s.request.sampling) for s in fake.seen]
    assert [(k, getattr(s, k)) for k, s in got] == [
        ("json_schema", '{"type":"integer"}'), ("regex", "[ab]{1,3}"),
        ("ebnf", 'root ::= "x"'), ("json_schema", '{"type": "string"}')]
    assert got[1][1].HasField("temperature") and not got[0][1].HasField("temperature")


def test_cli_constraint_reaches_the_wire(fake: FakeGenerateService, target: str) -> None:
    res = cli("--target", target, "--regex", "[0-9]{2}", "hello")
    assert res.returncode == 0, res.stderr
    assert fake.seen[0].request.sampling.regex == "[0-9]{2}"


CONNECTIONS_SCRIPT = """
const { GenerateClient } = require(process.argv[1]);
(async () => {
  const c = new GenerateClient(process.argv[2], { connections: 3 });
  for (let i = 0; i < 6; i++) await c.generateText(`three ${i}`, { maxNewTokens: 1 });
  const aborted = await c.abort(['y', 'z']);
  c.close();
  let refused = null;
  try { new GenerateClient(process.argv[2], { connections: 0 }); }
  catch (err) { refused = err.name; }
  console.log(JSON.stringify({ aborted, refused }));
})().catch((err) => { console.error(err); process.exit(1); });
"""


def test_library_connections(fake: FakeGenerateService, target: str) -> None:
    """As the Python client's `connections`: generate() takes the connections in turn, abort()
    asks each (a server with several gateways gives each connection to one of them)."""
    done = subprocess.run([str(NODE), "-e", CONNECTIONS_SCRIPT, str(NODE_DIR / "index.js"), target],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == {"aborted": 6, "refused": "RangeError"}
    peers = [s.peer for s in fake.seen]
    assert len(set(peers)) == 3 and peers[:3] == peers[3:]
    assert set(fake.abort_peers) == set(peers)
