"""grpc-shell: a chat REPL over radixserve's streaming Generate RPC.

Every turn sends the whole conversation, so the server's radix cache serves the shared prefix of
the previous turns and only the new text is prefilled.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import grpc

from . import Client, Delta, Finished, RadixServeError
from .channel import DEFAULT_TARGET
from .types import ChatMessage, ModelInfo, ServerInfo

HELP = """\
commands:
  /system <text>      set the system prompt (no text: clear it)
  /temperature <x>    sampling temperature for the next replies (0 = greedy; no value: show it)
  /max_tokens <n>     cap on new tokens per reply (no value: show it)
  /json <schema>      replies follow this JSON Schema (text, or @file)
  /regex <pattern>    replies match this regular expression in full (text, or @file)
  /ebnf <grammar>     replies follow this EBNF grammar, start rule `root` (text, or @file)
  /free               drop the reply constraint (no value on the three above: show it)
  /reset              forget the conversation (the system prompt and settings stay)
  /stats              server load, KV cache pages and prefix-cache hit rate
  /help               this text
  /exit               quit (Ctrl-D works too)
Ctrl-C stops the reply being generated and returns to the prompt."""

EPILOG = "exit status: 0, or the gRPC status code of the error (e.g. 14 for UNAVAILABLE)."


@dataclass
class Conversation:
    """What one REPL session sends: settings plus the turns so far."""

    system: str | None = None
    temperature: float | None = None  # None: the server's default
    max_tokens: int | None = None
    # The structured-output constraint of the next replies: (kind, text), kind as the client's
    # keyword (json_schema, regex or ebnf); None: free text.
    constraint: tuple[str, str] | None = None
    chat: bool = True  # False when the model has no chat template: send a plain transcript
    turns: list[ChatMessage] = field(default_factory=list)

    def messages(self, user_text: str) -> list[ChatMessage]:
        head = [ChatMessage("system", self.system)] if self.system else []
        return head + self.turns + [ChatMessage("user", user_text)]

    def transcript(self, user_text: str) -> str:
        # Append-only layout so consecutive turns still share a growing prefix.
        lines = [f"{m.role}: {m.content}" for m in self.messages(user_text)]
        return "\n".join(lines) + "\nassistant:"


class Shell:
    def __init__(self, client: Client, conv: Conversation, out: TextIO = sys.stdout) -> None:
        self.client = client
        self.conv = conv
        self.out = out
        self.commands: dict[str, Callable[[str], bool]] = {
            "/system": self.cmd_system,
            "/temperature": self.cmd_temperature,
            "/max_tokens": self.cmd_max_tokens,
            "/json": lambda arg: self.cmd_constraint("json_schema", arg),
            "/regex": lambda arg: self.cmd_constraint("regex", arg),
            "/ebnf": lambda arg: self.cmd_constraint("ebnf", arg),
            "/free": self.cmd_free,
            "/reset": self.cmd_reset,
            "/stats": self.cmd_stats,
            "/help": self.cmd_help,
            "/exit": self.cmd_exit,
            "/quit": self.cmd_exit,
        }

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def turn(self, user_text: str, *, footer: bool = True) -> Finished:
        """Stream one reply to the terminal; on success add the exchange to the history.

        KeyboardInterrupt propagates after `closing` has cancelled the RPC, leaving history as
        it was before the turn.
        """
        conv = self.conv
        text, messages = (
            (None, conv.messages(user_text)) if conv.chat else (conv.transcript(user_text), None)
        )
        constraint = dict([conv.constraint]) if conv.constraint else {}
        stream = self.client.generate(
            text, messages=messages, temperature=conv.temperature, max_new_tokens=conv.max_tokens,
            **constraint,
        )
        parts: list[str] = []
        finished: Finished | None = None
        with closing(stream):
            for ev in stream:
                if isinstance(ev, Delta):
                    parts.append(ev.text)
                    self.out.write(ev.text)
                    self.out.flush()
                elif isinstance(ev, Finished):
                    finished = ev
        self.out.write("\n")
        if finished is None:
            raise RadixServeError(grpc.StatusCode.UNKNOWN, "stream ended without a Finished event")
        conv.turns += [ChatMessage("user", user_text), ChatMessage("assistant", "".join(parts))]
        if footer:
            u = finished.usage
            self.say(
                f"[{finished.finish_reason}: {u.completion_tokens} tokens, prompt {u.prompt_tokens}"
                f" ({u.cached_tokens} cached), {finished.timings.total_seconds:.2f}s]"
            )
        return finished

    def handle(self, line: str) -> bool:
        """Run one input line; returns False when the shell should exit."""
        line = line.strip()
        if not line:
            return True
        if line.startswith("/"):
            name, _, arg = line.partition(" ")
            command = self.commands.get(name)
            if command is None:
                self.say(f"unknown command {name}; /help lists them")
                return True
            return command(arg.strip())
        try:
            self.turn(line)
        except KeyboardInterrupt:
            self.say("\n[cancelled]")
        except RadixServeError as err:
            self.say(describe_error(err, self.client.config.target))
        return True

    def cmd_system(self, arg: str) -> bool:
        self.conv.system = arg or None
        self.say(f"system prompt set: {arg}" if arg else "system prompt cleared")
        return True

    def cmd_temperature(self, arg: str) -> bool:
        if arg:
            try:
                value = float(arg)
            except ValueError:
                self.say(f"not a number: {arg}")
                return True
            if value < 0:
                self.say("temperature must be >= 0")
                return True
            self.conv.temperature = value
        shown = "server default" if self.conv.temperature is None else self.conv.temperature
        self.say(f"temperature: {shown}")
        return True

    def cmd_max_tokens(self, arg: str) -> bool:
        if arg:
            if not arg.isdigit() or int(arg) < 1:
                self.say(f"max_tokens must be a positive integer, got {arg}")
                return True
            self.conv.max_tokens = int(arg)
        shown = "server default" if self.conv.max_tokens is None else self.conv.max_tokens
        self.say(f"max_tokens: {shown}")
        return True

    def cmd_constraint(self, kind: str, arg: str) -> bool:
        if arg:
            try:
                self.conv.constraint = (kind, read_constraint(arg))
            except OSError as err:
                self.say(f"cannot read {arg[1:]}: {err.strerror}")
                return True
        self.say(describe_constraint(self.conv.constraint))
        return True

    def cmd_free(self, arg: str) -> bool:
        self.conv.constraint = None
        self.say(describe_constraint(None))
        return True

    def cmd_reset(self, arg: str) -> bool:
        self.conv.turns.clear()
        self.say("conversation cleared")
        return True

    def cmd_stats(self, arg: str) -> bool:
        try:
            self.say(format_stats(self.client.server_info(timeout=5)))
        except RadixServeError as err:
            self.say(describe_error(err, self.client.config.target))
        return True

    def cmd_help(self, arg: str) -> bool:
        self.say(HELP)
        return True

    def cmd_exit(self, arg: str) -> bool:
        return False


def read_constraint(arg: str) -> str:
    """The constraint text: `arg` itself, or the contents of the file named after an `@`."""
    return Path(arg[1:]).expanduser().read_text() if arg.startswith("@") else arg


def describe_constraint(constraint: tuple[str, str] | None) -> str:
    if constraint is None:
        return "replies: free text"
    kind, text = constraint
    shown = text if len(text) <= 60 else text[:57] + "..."
    return f"replies follow {kind}: {shown}"


def format_stats(s: ServerInfo) -> str:
    pages = (
        f"kv pages: {s.kv_pages_total} total, {s.kv_pages_free} free, "
        f"{s.kv_pages_evictable} evictable, {s.kv_pages_protected} in use (page size {s.page_size})"
    )
    hits = (
        f"prefix cache hit rate: {s.prefix_cache_hit_rate:.1%} "
        f"({s.cached_tokens_total} of {s.prompt_tokens_total} prompt tokens)"
    )
    load = f"server {s.version}: {s.running_requests} running, {s.waiting_requests} waiting"
    return f"{load}\n{pages}\n{hits}"


def describe_error(err: RadixServeError, target: str) -> str:
    if err.code == grpc.StatusCode.UNAVAILABLE:
        return (
            f"error: cannot reach radixserve at {target} ({err.message}).\n"
            "Is it running? Start one with `radixserve serve`, or pass --target HOST:PORT."
        )
    if err.code == grpc.StatusCode.UNAUTHENTICATED:
        return f"error: UNAUTHENTICATED: {err.message} (pass --api-key)"
    return f"error: {err.code.name}: {err.message}"


def exit_code(err: RadixServeError) -> int:
    value = err.code.value[0]
    return value if isinstance(value, int) and value > 0 else 1


def connect(shell: Shell) -> ModelInfo:
    """Check the server is there and pick chat or plain-text prompts from its model."""
    info = shell.client.model_info(timeout=10)
    shell.conv.chat = info.has_chat_template
    return info


def read_lines(history_file: Path) -> Callable[[], str]:
    """A line reader: prompt_toolkit on a terminal, plain input() when stdin is piped."""
    if not sys.stdin.isatty():
        return lambda: input()
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    history_file.parent.mkdir(parents=True, exist_ok=True)
    session: PromptSession[str] = PromptSession(history=FileHistory(str(history_file)))
    return lambda: session.prompt(">>> ")


def repl(shell: Shell, read: Callable[[], str]) -> int:
    while True:
        try:
            if not shell.handle(read()):
                return 0
        except KeyboardInterrupt:
            # Ctrl-C at the prompt clears the line; a second one while a cancelled reply is
            # being cleaned up lands here too and must not end the session.
            continue
        except EOFError:  # Ctrl-D
            shell.say("")
            return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="grpc-shell", description="Chat with a radixserve server.", epilog=EPILOG
    )
    env = os.environ.get
    p.add_argument("--target", default=env("RADIXSERVE_TARGET", DEFAULT_TARGET), help="HOST:PORT")
    p.add_argument("--api-key", default=env("RADIXSERVE_API_KEY"), help="sent as a bearer token")
    p.add_argument("--tls", action="store_true", help="connect with TLS (system roots)")
    p.add_argument("-c", dest="command", metavar="PROMPT", help="run one turn, print it, exit")
    p.add_argument("--system", help="system prompt")
    p.add_argument("--temperature", type=float)
    p.add_argument("--max-tokens", type=int)
    constraint = p.add_mutually_exclusive_group()
    for flag, what in (("--json-schema", "a JSON Schema"), ("--regex", "a regular expression"),
                       ("--ebnf", "an EBNF grammar (start rule root)")):
        constraint.add_argument(flag, metavar="TEXT|@FILE", help=f"replies follow {what}")
    p.add_argument(
        "--history-file",
        type=Path,
        default=Path(env("RADIXSERVE_SHELL_HISTORY", "~/.radixserve_shell_history")).expanduser(),
    )
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    conv = Conversation(args.system, args.temperature, args.max_tokens)
    for kind in ("json_schema", "regex", "ebnf"):
        arg = getattr(args, kind)
        if arg:
            try:
                conv.constraint = (kind, read_constraint(arg))
            except OSError as err:
                print(f"grpc-shell: cannot read {arg[1:]}: {err.strerror}", file=sys.stderr)
                return 2
    with Client(args.target, args.api_key, tls=args.tls) as client:
        shell = Shell(client, conv)
        try:
            info = connect(shell)
            if args.command is not None:
                shell.turn(args.command, footer=False)
                return 0
        except RadixServeError as err:
            print(describe_error(err, args.target), file=sys.stderr)
            return exit_code(err)
        except KeyboardInterrupt:
            print("\n[cancelled]", file=sys.stderr)
            return 130
        shell.say(
            f"connected to {args.target}: model {info.model_name or '?'}, context "
            f"{info.max_context}"
        )
        if not conv.chat:
            shell.say("the model has no chat template: turns are sent as a plain-text transcript")
        shell.say("/help lists commands; Ctrl-C stops a reply; Ctrl-D exits")
        return repl(shell, read_lines(args.history_file))


if __name__ == "__main__":
    sys.exit(main())
