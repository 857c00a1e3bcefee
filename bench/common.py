"""Shared pieces of the benchmarks: result tables and JSON output."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

import torch


def device_name(device: str) -> str:
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return torch.cuda.get_device_name(0)
    return f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads"


def print_table(title: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    cols = list(rows[0])
    cells = [[_fmt(r.get(c)) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]
    print(f"\n{title}")
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    print("  ".join("-" * w for w in widths))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) >= 1 else f"{v:.4f}"
    return str(v)


def write_json(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        payload = {"date": time.strftime("%Y-%m-%d %H:%M:%S"), **payload}
        Path(path).write_text(json.dumps(payload, indent=2))
        print(f"\nwrote {path}")
