"""The line budget (docs/conventions.md #3): code lines per source file.

Blank lines, comments and docstrings do not count.

One rule set, used by `make lint-size` and by tests/services/test_services_hygiene.py: an ordinary
file holds at most 300 code lines; servers, entry points and client libraries at most 450.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ORDINARY, EDGE = 300, 450
# Folders checked; one that does not exist (yet) is skipped.
FOLDERS = ("engine", "native", "services", "clients/python/radixserve/client", "bench")
EDGE_FOLDERS = ("clients/python/radixserve/client", "bench")  # client libraries, benchmarks
EDGE_FILES = {"server.py", "cli.py", "supervisor.py"}  # servers, entry points
SKIP = ("_pb2", "demo_corpus.py")  # generated code and data


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


def budget(path: Path, root: Path = ROOT) -> int:
    rel = path.resolve().relative_to(root).as_posix()
    edge = path.name in EDGE_FILES or any(rel.startswith(f"{f}/") for f in EDGE_FOLDERS)
    return EDGE if edge else ORDINARY


def sources(root: Path = ROOT) -> list[Path]:
    """Every budgeted .py file under the checked folders that exist."""
    found = []
    for folder in FOLDERS:
        if (root / folder).is_dir():
            found += [p for p in sorted((root / folder).rglob("*.py"))
                      if not any(s in p.name for s in SKIP)]
    return found


def over_budget(root: Path = ROOT) -> list[str]:
    over = []
    for path in sources(root):
        n, limit = code_lines(path), budget(path, root)
        if n > limit:
            over.append(f"{path.relative_to(root)}: {n} code lines (budget {limit})")
    return over


def main() -> int:
    over = over_budget()
    for line in over:
        print(line)
    print(f"line budget: {len(over)} file(s) over")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
