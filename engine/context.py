"""The one forward context: batch metadata that layers read during a forward pass.

Set with `with forward_context(ctx): model(...)`; nesting is a bug and asserts.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from radixserve.engine.attention.base import AttentionBackend, AttentionMetadata
    from radixserve.engine.kvcache.pool import KVCachePool


@dataclass
class ForwardContext:
    backend: AttentionBackend
    metadata: AttentionMetadata
    kv_pool: KVCachePool


_current: ForwardContext | None = None


@contextmanager
def forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    global _current
    assert _current is None, "forward contexts do not nest"
    _current = ctx
    try:
        yield ctx
    finally:
        _current = None


def get_forward_context() -> ForwardContext:
    assert _current is not None, "layers must run inside forward_context()"
    return _current
