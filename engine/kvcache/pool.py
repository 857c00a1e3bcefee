"""The paged K/V tensors. A KV location is `page * page_size + offset`."""

from __future__ import annotations

import torch


class KVCachePool:
    def __init__(self, num_layers: int, num_pages: int, page_size: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.num_pages, self.page_size = num_pages, page_size
        shape = (num_layers, num_pages * page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, locations, nkv, hd)
        self.v = torch.zeros(shape, dtype=dtype, device=device)

    def store(self, layer_id: int, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """loc: (T,) int64 locations; k, v: (T, nkv, hd)."""
        self.k[layer_id].index_copy_(0, loc, k.to(self.k.dtype))
        self.v[layer_id].index_copy_(0, loc, v.to(self.v.dtype))

    @property
    def bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
