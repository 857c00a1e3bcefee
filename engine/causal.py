"""What causal attention reads, counted without torch: the scheduler's prefill budget (which the
gateway's command line reaches through EngineConfig) and the model runner's choice of graph both
price prompt tokens by the keys they attend to."""

from __future__ import annotations


def attended_keys(start: int, end: int) -> int:
    """Keys that causal attention of positions [start, end) of one sequence reads in all: the token
    at position p attends to p + 1."""
    return (end * (end + 1) - start * (start + 1)) // 2
