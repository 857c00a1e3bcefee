"""Read docker/ the way docker-compose does, without a Docker engine: the compose YAML with its
`${VAR:-default}` substitution, env files, and the few Dockerfile facts the tests rely on."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "docker-compose.yml"
COMPOSE_GPU = DOCKER / "docker-compose.gpu.yml"
COMPOSE_DP2 = DOCKER / "docker-compose.dp2.yml"
COMPOSE_DP2_GPU = DOCKER / "docker-compose.dp2.gpu.yml"
DOCKERFILE = DOCKER / "Dockerfile"
ENV_EXAMPLE = DOCKER / ".env.example"
SERVICES = ("tokenizer", "detokenizer", "scheduler", "gateway")

# ${NAME}, ${NAME:-default}, ${NAME-default}; `$$` is a literal dollar (compose's rules).
_VAR = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def load(path: Path = COMPOSE) -> dict[str, Any]:
    """The compose file as YAML (anchors and `<<` merges resolved), before substitution."""
    return yaml.safe_load(path.read_text())


def compose_config(*files: os.PathLike[str], env_file: str) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f FILE... config` with RADIXSERVE_ENV_FILE=env_file; skips without it."""
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    args = [exe]
    for path in files:
        args += ["-f", str(path)]
    env = {**os.environ, "RADIXSERVE_ENV_FILE": env_file}
    return subprocess.run([*args, "config"], check=False, cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Substitute variables in every string of `value`, recursively."""
    if isinstance(value, str):
        return _VAR.sub(lambda m: _substitute(m, env), value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def _substitute(match: re.Match[str], env: Mapping[str, str]) -> str:
    if match.group(0) == "$$":
        return "$"
    name, op, default = match.group(1), match.group(2), match.group(3) or ""
    value = env.get(name)
    if op == ":-" and not value:
        return default
    if op == "-" and value is None:
        return default
    return value or ""


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a compose env file; blank lines and # comments skipped."""
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path}: not KEY=VALUE: {line!r}"
        env[key.strip()] = value
    return env


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's `environment:` (mapping or KEY=VALUE list form) as a dict."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        return dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


def addresses(value: str) -> list[str]:
    """A RADIXSERVE_*_ADDR value: one address or several, comma-separated (services/cli.py)."""
    return [a.strip() for a in value.split(",") if a.strip()]


def flag(command: list[str], name: str) -> str:
    """The value after `name` in an argv list."""
    assert name in command, f"{name} missing from {command}"
    return command[command.index(name) + 1]


class Stage(NamedTuple):
    name: str
    base: str
    body: str


def dockerfile_stages(text: str | None = None) -> tuple[dict[str, str], dict[str, Stage]]:
    """(global ARG defaults, stages by name) of docker/Dockerfile, line continuations joined.
    A stage's base has the global ARGs substituted; its body is every instruction after FROM."""
    text = (text if text is not None else DOCKERFILE.read_text()).replace("\\\n", " ")
    args: dict[str, str] = {}
    heads: list[tuple[str, str]] = []
    bodies: list[list[str]] = []
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            named = len(words) > 3 and words[2].upper() == "AS"
            base = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), words[1])
            heads.append((words[3] if named else f"#{len(heads)}", base))
            bodies.append([])
        elif not heads and words[0] == "ARG" and "=" in words[1]:
            key, _, value = words[1].partition("=")
            args[key] = value
        elif heads:
            bodies[-1].append(line.strip())
    stages = {name: Stage(name, base, "\n".join(body)) for (name, base), body in zip(heads, bodies)}
    return args, stages
