"""Source gates: line budgets (docs/conventions.md #3, the one checker in tools/line_budget.py), and
no unsafe deserialization in any shipped source: engine/, services/, native/, clients/
(docs/reliability.md #27)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_line_budget():
    spec = importlib.util.spec_from_file_location("line_budget", ROOT / "tools" / "line_budget.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


line_budget = _load_line_budget()


@pytest.mark.parametrize("path", line_budget.sources(ROOT), ids=lambda p: str(p.relative_to(ROOT)))
def test_line_budget(path: Path) -> None:
    budget = line_budget.budget(path, ROOT)
    assert line_budget.code_lines(path) <= budget, f"{path} is over its {budget}-line budget"


def test_line_budget_rules() -> None:
    assert line_budget.budget(ROOT / "services" / "gateway" / "server.py", ROOT) == 450
    assert line_budget.budget(ROOT / "services" / "gateway" / "links.py", ROOT) == 300
    assert line_budget.budget(ROOT / "engine" / "core.py", ROOT) == 300
    assert line_budget.budget(ROOT / "bench" / "anything.py", ROOT) == 450
    assert not line_budget.over_budget(ROOT)


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
