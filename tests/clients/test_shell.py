"""grpc-shell driven on a pseudo-terminal against the fake GenerateService, as a person uses it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fake_server import FakeGenerateService, serve
from .pty_driver import PtyProcess

_SCRIPT = Path(sys.executable).with_name("grpc-shell")
# Prefer the installed console script (what a user runs); fall back to the module.
SHELL = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "radixserve.client.shell"]


def shell_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        TERM="xterm",
        PROMPT_TOOLKIT_NO_CPR="1",  # nobody answers cursor-position queries on a test pty
        HOME=str(tmp_path),
        RADIXSERVE_SHELL_HISTORY=str(tmp_path / "history"),
    )
    env.pop("RADIXSERVE_TARGET", None)
    env.pop("RADIXSERVE_API_KEY", None)
    return env


@pytest.fixture
def shell(target: str, tmp_path: Path) -> Iterator[PtyProcess]:
    proc = PtyProcess([*SHELL, "--target", target], shell_env(tmp_path))
    try:
        proc.expect(r"connected to 127\.0\.0\.1:\d+: model fake-model")
        proc.expect(">>>")
        yield proc
    finally:
        proc.close()


def chat(fake: FakeGenerateService, n: int) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in fake.wait_for(n).request.chat.messages]


def test_streams_and_keeps_history(
    shell: PtyProcess, fake: FakeGenerateService, tmp_path: Path
) -> None:
    shell.sendline("hello")
    shell.expect(r"echo: hello\n")
    shell.expect(r"\[eos: 11 tokens, prompt 5 \(3 cached\)")
    shell.expect(">>>")
    shell.sendline("again")
    shell.expect("echo: again")
    shell.expect(">>>")
    assert chat(fake, 1) == [("user", "hello")]
    assert chat(fake, 2) == [("user", "hello"), ("assistant", "echo: hello"), ("user", "again")]
    shell.send("\x04")  # Ctrl-D
    assert shell.wait() == 0
    assert "hello" in (tmp_path / "history").read_text()


def test_settings_commands_change_the_next_request(
    shell: PtyProcess, fake: FakeGenerateService
) -> None:
    shell.sendline("one")
    shell.expect("echo: one")
    shell.sendline("/temperature 0.3")
    shell.expect("temperature: 0.3")
    shell.sendline("/max_tokens 4")
    shell.expect("max_tokens: 4")
    shell.sendline("/system be terse")
    shell.expect("system prompt set: be terse")
    shell.sendline("two")
    shell.expect(r"\[length: 4 tokens")
    first, second = fake.seen[0].request, fake.wait_for(2).request
    assert not first.sampling.HasField("temperature")
    assert not first.stopping.HasField("max_new_tokens")
    assert second.sampling.temperature == pytest.approx(0.3)
    assert second.stopping.max_new_tokens == 4
    assert chat(fake, 2)[0] == ("system", "be terse") and len(chat(fake, 2)) == 4

    shell.sendline("/reset")
    shell.expect("conversation cleared")
    shell.sendline("three")
    shell.expect(r"\[length")
    assert chat(fake, 3) == [("system", "be terse"), ("user", "three")]
    shell.sendline("/temperature hot")
    shell.expect("not a number: hot")
    shell.sendline("/exit")
    assert shell.wait() == 0


def test_stats_help_and_unknown_commands(shell: PtyProcess) -> None:
    shell.sendline("/stats")
    shell.expect("server 0.0-fake: 1 running, 2 waiting")
    shell.expect("kv pages: 100 total, 60 free, 30 evictable, 10 in use")
    shell.expect(r"prefix cache hit rate: 25\.0% \(250 of 1000 prompt tokens\)")
    shell.sendline("/help")
    shell.expect("/max_tokens <n>")
    shell.sendline("/bogus")
    shell.expect("unknown command /bogus")


def test_ctrl_c_cancels_generation_and_shell_continues(
    shell: PtyProcess, fake: FakeGenerateService
) -> None:
    shell.sendline("hi")
    shell.expect("echo: hi")
    shell.sendline("long story please")
    shell.expect("tick tick tick")  # tokens show up while the reply is still being made
    long_turn = fake.wait_for(2)
    assert not long_turn.cancelled.is_set()
    shell.send("\x03")  # Ctrl-C
    shell.expect(r"\[cancelled\]")
    assert long_turn.cancelled.wait(5), "the server never saw the cancellation"
    shell.expect(">>>")
    shell.send("half a line\x03")  # Ctrl-C at the prompt just drops the line
    shell.expect(">>>")
    # Typed, then entered once it shows: keys sent while the interrupted prompt hands over to the
    # next one may land in either, and an Enter there was lost on a loaded machine (twice in
    # many runs, the text shown and the Enter gone). A second Enter is harmless (an empty line
    # is skipped), so the Enter is sent again if no reply comes: the turn must still be the
    # typed text alone.
    shell.send("after")
    shell.expect("after")
    shell.send("\r")
    try:
        shell.expect("echo: after", timeout=5.0)
    except AssertionError:
        shell.send("\r")
        shell.expect("echo: after")
    shell.expect(">>>")
    # The cancelled turn is not part of the conversation.
    assert chat(fake, 3) == [("user", "hi"), ("assistant", "echo: hi"), ("user", "after")]
    shell.send("\x04")
    assert shell.wait() == 0


def test_server_errors_are_reported_and_shell_continues(shell: PtyProcess) -> None:
    shell.sendline("error:INVALID_ARGUMENT prompt is longer than the context")
    shell.expect("error: INVALID_ARGUMENT: prompt is longer than the context")
    shell.sendline("fine")
    shell.expect("echo: fine")


def run_c(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SHELL, *args],
        env=shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_one_shot_mode(fake: FakeGenerateService, target: str, tmp_path: Path) -> None:
    res = run_c(tmp_path, "--target", target, "--api-key", "k1", "--temperature", "0", "-c", "yo")
    assert (res.returncode, res.stdout) == (0, "echo: yo\n"), res.stderr
    req = fake.seen[0]
    assert req.request.sampling.HasField("temperature") and req.request.sampling.temperature == 0
    assert req.metadata["authorization"] == "Bearer k1"

    res = run_c(tmp_path, "--target", target, "-c", "error:RESOURCE_EXHAUSTED queue full")
    assert res.returncode == 8  # RESOURCE_EXHAUSTED
    assert "RESOURCE_EXHAUSTED: queue full" in res.stderr


def test_one_shot_constraint_flags(
    fake: FakeGenerateService, target: str, tmp_path: Path
) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    res = run_c(tmp_path, "--target", target, "--json-schema", f"@{schema}", "-c", "yo")
    assert res.returncode == 0, res.stderr
    sampling = fake.seen[0].request.sampling
    assert sampling.WhichOneof("constraint") == "json_schema"
    assert sampling.json_schema == '{"type": "object"}'
    res = run_c(tmp_path, "--target", target, "--regex", "[a-z]+", "-c", "yo")
    assert fake.wait_for(2).request.sampling.regex == "[a-z]+"
    res = run_c(tmp_path, "--target", target, "--ebnf", f"@{tmp_path / 'missing'}", "-c", "yo")
    assert res.returncode == 2 and "cannot read" in res.stderr
    res = run_c(tmp_path, "--target", target, "--regex", "a", "--ebnf", "b", "-c", "yo")
    assert res.returncode == 2 and "not allowed with" in res.stderr


def test_constraint_commands_change_the_next_request(
    shell: PtyProcess, fake: FakeGenerateService
) -> None:
    shell.sendline("/regex (yes|no)")
    shell.expect(r"replies follow regex: \(yes\|no\)")
    shell.sendline("one")
    shell.expect("echo: one")
    shell.sendline("/free")
    shell.expect("replies: free text")
    shell.sendline("two")
    shell.expect("echo: two")
    first, second = fake.seen[0].request, fake.wait_for(2).request
    assert first.sampling.regex == "(yes|no)"
    assert second.sampling.WhichOneof("constraint") is None
    shell.sendline("/exit")
    assert shell.wait() == 0


def test_one_shot_unreachable_server(tmp_path: Path) -> None:
    from .test_client import free_port

    res = run_c(tmp_path, "--target", f"127.0.0.1:{free_port()}", "-c", "hi")
    assert res.returncode == 14  # UNAVAILABLE
    assert "cannot reach radixserve at 127.0.0.1:" in res.stderr
    assert "radixserve serve" in res.stderr


def test_model_without_chat_template_gets_a_transcript(tmp_path: Path) -> None:
    fake = FakeGenerateService(has_chat_template=False)
    with serve(fake) as target:
        res = run_c(tmp_path, "--target", target, "--system", "sys", "-c", "plain")
    assert res.returncode == 0 and res.stdout == "echo: plain\n"
    assert fake.seen[0].request.text == "system: sys\nuser: plain\nassistant:"


def test_piped_input_without_a_terminal(
    fake: FakeGenerateService, target: str, tmp_path: Path
) -> None:
    res = subprocess.run(
        [*SHELL, "--target", target],
        input="first\n/max_tokens 2\nsecond\n",
        env=shell_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert "echo: first\n" in res.stdout and "ec\n[length: 2 tokens" in res.stdout
    assert len(chat(fake, 2)) == 3
