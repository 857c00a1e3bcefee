"""Source gates for services/: line budgets (STYLE rule 1) and no pickle anywhere (DESIGN §2.4)."""

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


def test_no_pickle_in_services() -> None:
    pattern = re.compile(r"\b(pickle|cPickle|dill|recv_pyobj|marshal\.loads)\b")
    offenders = [str(p) for p in SERVICES.rglob("*.py") if pattern.search(p.read_text())]
    assert not offenders
