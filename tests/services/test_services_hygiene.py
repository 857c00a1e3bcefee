"""Source gates: line budgets of services/ (docs/conventions.md #3), and no unsafe deserialization
in any shipped source: engine/, services/, native/, clients/ (docs/reliability.md #27)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
EDGE = {"server.py", "cli.py", "supervisor.py", "bench_serving.py"}  # servers and entry points


def code_lines(path: Path) -> int:
    """Lines that are neither blank, comments, nor docstring-only."""
    count, in_doc = 0, False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if in_doc:
            in_doc = not line.endswith(('"""', "'''"))
            continue
        if line.startswith(('"""', "'''")):
            quote = line[:3]
            in_doc = not (len(line) > 3 and line.endswith(quote))
            continue
        if line and not line.startswith("#"):
            count += 1
    return count


@pytest.mark.parametrize("path", sorted(SERVICES.rglob("*.py")), ids=lambda p: str(p.relative_to(SERVICES)))
def test_line_budget(path: Path) -> None:
    budget = 450 if path.name in EDGE else 300
    assert code_lines(path) <= budget, f"{path} is over its {budget}-line budget"


ROOT = SERVICES.parent
GATED = ("engine", "services", "native", "clients")  # everything that ships
UNSAFE = re.compile(
    r"\b(pickle|cPickle|dill|recv_pyobj|shelve)\b"  # object deserialization over IPC or files
    r"|\bmarshal\.loads?\b"
    r"|(?<![.\w])eval\("  # eval() itself; model.eval() and other methods are fine
    r"|(?<![.\w])exec\("
    r"|\btorch\.load\((?![^)]*weights_only\s*=\s*True)"  # only with weights_only=True
)


def _shipped_sources() -> list[Path]:
    files = []
    for top in GATED:
        for path in (ROOT / top).rglob("*"):
            skip = {"node_modules", "__pycache__", "build", ".venv"} & set(path.parts)
            if path.suffix in (".py", ".pyx", ".js") and not skip and path.is_file():
                files.append(path)
    return files


def test_no_unsafe_deserialization_anywhere() -> None:
    """docs/reliability.md #27: protobuf only on every wire and in every file the engine reads."""
    files = _shipped_sources()
    assert len(files) > 50, "the gate found too few files to be looking in the right place"
    offenders = [
        f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
        for path in files
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if UNSAFE.search(line)
    ]
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("line", [
    "import pickle", "obj = sock.recv_pyobj()", "marshal.loads(b)", "eval(text)",
    "torch.load(path)", "torch.load(path, weights_only=False)",
])
def test_unsafe_gate_catches(line: str) -> None:
    assert UNSAFE.search(line)


@pytest.mark.parametrize("line", ["model.eval()", "torch.load(path, weights_only=True)"])
def test_unsafe_gate_allows(line: str) -> None:
    assert not UNSAFE.search(line)
