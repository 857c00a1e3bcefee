"""Fail when a source file exceeds its line budget, counting code lines (not comments or blanks)."""

from __future__ import annotations

import sys
from pathlib import Path

BUDGETS = {"engine": 300, "native": 300, "services": 450, "clients/python/radixserve/client": 450}
SKIP = ("_pb2", "demo_corpus.py")


def code_lines(path: Path) -> int:
    count, in_doc = 0, False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith(('"""', "'''")):
            quotes = line[:3]
            if not (len(line) > 3 and line.endswith(quotes)):
                in_doc = not in_doc
            continue
        if in_doc or not line or line.startswith("#"):
            continue
        count += 1
    return count


def main() -> int:
    root = Path(__file__).resolve().parent.parent
    over = []
    for folder, budget in BUDGETS.items():
        for path in sorted((root / folder).rglob("*.py")):
            if any(s in path.name for s in SKIP):
                continue
            n = code_lines(path)
            if n > budget:
                over.append(f"{path.relative_to(root)}: {n} code lines (budget {budget})")
    for line in over:
        print(line)
    print(f"line budget: {len(over)} file(s) over")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
