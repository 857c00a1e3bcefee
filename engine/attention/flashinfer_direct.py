"""FlashInfer's paged prefill kernel without the wrapper: a plan per step, a bare call per layer.
(`DecodeCall`, at the end, does the same for the decode kernel's run, after the wrapper's plan.)

`BatchPrefillWithPagedKVCacheWrapper.run` re-derives on every call what a step holds constant (dtype
and shape checks, unpacking the KV tuple, the mask mode, scale defaults and, on the fa3 backend, a
kernel that turns page ids into token offsets) before it calls the planned module's `paged_run`, and
allocates the output. Its `plan` takes the longest query and KV with Python's `max` over tensor
elements (microseconds per request) and copies each of four inputs to the device on its own. Here a
step plans from host lists with one upload (page ids included), turns page ids into offsets once,
and binds `paged_run`'s arguments once; each layer passes q, its K/V pages and the caller's output.

What this mirrors of FlashInfer (written against 0.5.3); `DirectPrefill` checks it when the backend
forms the path, after its first prefill plan through the wrapper, and raises `Unsupported` (the
backend then keeps the wrapper, and logs why) when anything differs:
  * the planned wrapper's attributes: `_backend` in ("fa2", "fa3"), `_cached_module` (`.plan`,
    `.paged_run`), `_jit_module` None, `_use_cuda_graph` False, `_kv_layout` "NHD",
    `_float_workspace_buffer`, `_int_workspace_buffer`, `_pin_memory_int_workspace_buffer`,
    `_workspace_size`, `_plan_info`, `device`, on fa3 `_vector_sparse_indices_buffer`, and the
    device inputs `plan` leaves (`_qo_indptr_buf`, `_paged_kv_indptr_buf`, `_paged_kv_indices_buf`,
    `_paged_kv_last_page_len_buf`, `_kv_lens_buffer`, on fa3 `_vector_sparse_indptr_buffer`);
  * `paged_run`'s parameter names, in order (`PAGED_RUN_PARAMS`: the positional list `run` passes);
  * the positional arguments of the module's `plan` per backend: the first step is planned both
    ways and must give the same plan info, the same host schedule and the same device inputs;
  * on fa3, `flashinfer.page.block_sparse_indices_to_vector_sparse_offsets` (parameter names);
  * `flashinfer.utils`: `MaskMode.CAUSAL`, `TensorLayout`, `device_support_pdl`,
    `_get_cache_alibi_slopes_buf`.
The configuration is the backend's only one: causal, no custom mask, no sliding window, no logits
soft cap, no positional encoding in the kernel, sm_scale head_dim ** -0.5, NHD layout, q and KV of
one 16-bit dtype, no lse.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch
from radixserve.engine.attention.base import (
    LayerCall,
    StepLayout,
    last_page_lens,
    page_cells,
    page_indices,
    pages_at,
    pages_per_request,
    prefix_sums,
)
from radixserve.engine.host_buffers import HostBuffers
from radixserve.engine.upload import upload_columns

PAGED_RUN_PARAMS = (
    "float_workspace_buffer", "int_workspace_buffer", "plan_info_vec", "q", "paged_k_cache",
    "paged_v_cache", "qo_indptr", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len",
    "o", "maybe_lse", "mask_mode", "layout", "window_left", "enable_pdl", "maybe_custom_mask",
    "maybe_mask_indptr", "maybe_alibi_slopes", "maybe_prefix_len_ptr",
    "maybe_token_pos_in_items_ptr", "maybe_max_item_len_ptr", "logits_soft_cap", "sm_scale",
    "scale_q", "scale_k", "scale_v", "rope_scale", "rope_theta", "token_pos_in_items_len",
    "workspace_size", "num_qo_heads", "num_kv_heads", "block_tables", "kv_lens_buffer",
    "page_size", "max_q_len", "max_kv_len", "batch_size", "cum_seq_lens_q", "cum_seq_lens_kv",
    "sinks")
DECODE_RUN_PARAMS = (
    "float_workspace_buffer", "int_workspace_buffer", "plan_info_vec", "q", "paged_k_cache",
    "paged_v_cache", "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "o",
    "maybe_lse", "kv_layout_code", "window_left", "enable_pdl", "alibi_slopes", "logits_soft_cap",
    "sm_scale", "rope_scale", "rope_theta")
TO_OFFSETS_PARAMS = ("block_sparse_indices", "block_sparse_indptr", "vector_sparse_offsets",
                     "vector_sparse_indptr", "kv_lens", "stride_block", "stride_n", "block_size")

WINDOW_LEFT = -1  # no sliding window
ROPE_SCALE, ROPE_THETA = 1.0, 1e4  # run's defaults (no positional encoding in the kernel)


class Unsupported(Exception):
    """The direct path cannot be formed with this FlashInfer; the message says why."""


def _attr(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError:
        raise Unsupported(f"{type(obj).__name__} has no {name}") from None


def _params(fn: Any) -> tuple[str, ...]:
    try:
        return tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return ()


class _Inputs:
    """One step's plan inputs: host lists, the host tensors `plan` reads, the device copies."""

    def __init__(self, layout: StepLayout, fa3: bool, device: torch.device,
                 buffers: HostBuffers | None = None) -> None:
        """`buffers`: where the upload is staged (`upload_columns`); a step's plan passes the
        planner's own, a one-off check none."""
        P, seq, ext = layout.page_size, layout.seq_lens, layout.extend_lens
        npages = pages_per_request(seq, P)
        self.batch, self.rows = len(seq), sum(ext)
        self.max_q, self.max_kv = max(ext), max(seq)
        qo, kv = prefix_sums(ext), prefix_sums(npages)
        last = last_page_lens(seq, npages, P)
        # fa3 plans over token offsets (below) where pages hold more than one token
        self.token_offsets = fa3 and P != 1
        plan_kv = prefix_sums(seq) if self.token_offsets else kv
        i32 = torch.int32
        self.qo_h = torch.tensor(qo, dtype=i32)
        self.kv_h = torch.tensor(plan_kv, dtype=i32)
        self.kv_lens_h = torch.tensor(seq, dtype=i32)
        columns: list[tuple[Any, torch.dtype]] = [(qo, i32), (kv, i32), (last, i32), (seq, i32),
                                                   (plan_kv, i32)]
        cells = None
        if layout.slot_list is not None:
            cells = page_cells(layout.slot_list, npages, layout.page_table.size(1), P)
            columns.append((cells, torch.int64))
        cols = upload_columns(columns, device, buffers)
        self.qo, self.kv, self.last, self.kv_lens, self.plan_kv = cols[:5]
        if cells is not None:
            self.indices = pages_at(layout.page_table, cols[5], P)
        else:
            self.indices = page_indices(layout.page_table, layout.slots, npages, P)


class DirectPrefill:
    """Plans and runs the kernels of a wrapper that has planned once (so that FlashInfer has chosen
    its backend and built the module). Raises Unsupported where this FlashInfer differs."""

    def __init__(self, wrapper: Any, num_qo_heads: int, num_kv_heads: int, head_dim: int,
                 sm_scale: float) -> None:
        w = wrapper
        self.backend = _attr(w, "_backend")
        if self.backend not in ("fa2", "fa3"):
            raise Unsupported(f"FlashInfer planned with its {self.backend!r} backend")
        if _attr(w, "_jit_module") is not None:
            raise Unsupported("the wrapper runs a custom JIT module")
        if _attr(w, "_use_cuda_graph"):
            raise Unsupported("the wrapper is in CUDA graph mode")
        if _attr(w, "_kv_layout") != "NHD":
            raise Unsupported(f"KV layout {w._kv_layout}")
        module = _attr(w, "_cached_module")
        self._plan_fn, self._run_fn = _attr(module, "plan"), _attr(module, "paged_run")
        if _params(self._run_fn) != PAGED_RUN_PARAMS:
            raise Unsupported(f"paged_run takes {_params(self._run_fn)}, not the parameters of "
                              "FlashInfer 0.5.3")
        self._fws = _attr(w, "_float_workspace_buffer")
        self._iws = _attr(w, "_int_workspace_buffer")
        self._ws_size = _attr(w, "_workspace_size")
        self.device = _attr(w, "device")
        self._host = HostBuffers(pin=self.device.type == "cuda")  # the plan's upload, one a step
        self._to_offsets: Any = None
        if self.backend == "fa3":
            self._offsets_buf = _attr(w, "_vector_sparse_indices_buffer")
            page = importlib.import_module("flashinfer.page")
            self._to_offsets = _attr(page, "block_sparse_indices_to_vector_sparse_offsets")
            if _params(self._to_offsets) != TO_OFFSETS_PARAMS:
                raise Unsupported("block_sparse_indices_to_vector_sparse_offsets takes "
                                  f"{_params(self._to_offsets)}")
        fi_utils = importlib.import_module("flashinfer.utils")
        self._mask_mode = _attr(fi_utils, "MaskMode").CAUSAL.value
        self._layout = _attr(fi_utils, "TensorLayout")["NHD"].value
        self._enable_pdl = bool(_attr(fi_utils, "device_support_pdl")(self.device))
        self._alibi = _attr(fi_utils, "_get_cache_alibi_slopes_buf")(num_qo_heads, self.device)
        self.num_qo_heads, self.num_kv_heads, self.head_dim = num_qo_heads, num_kv_heads, head_dim
        self.sm_scale = sm_scale

    # -- plan -------------------------------------------------------------------------------------
    def _plan_info(self, inputs: _Inputs, page_size: int, pinned: torch.Tensor,
                   int_workspace: torch.Tensor) -> Any:
        """The module's plan, with the arguments `BatchPrefillWithPagedKVCacheWrapper.plan` passes:
        it writes the schedule into `pinned` and queues its copy into `int_workspace`."""
        args = [self._fws, int_workspace, pinned, inputs.qo_h, inputs.kv_h, inputs.kv_lens_h,
                inputs.rows, inputs.batch, self.num_qo_heads, self.num_kv_heads, page_size,
                False,  # CUDA graph mode
                self.head_dim, self.head_dim, True, WINDOW_LEFT]  # head dims qk/vo, causal
        if self.backend == "fa2":
            args += [-1, False, 0]  # fixed_split_size, disable_split_kv, num_colocated_ctas
        return self._plan_fn(*args)

    def _checked_plan_info(self, inputs: _Inputs, page_size: int, pinned: torch.Tensor,
                           int_workspace: torch.Tensor) -> Any:
        try:
            return self._plan_info(inputs, page_size, pinned, int_workspace)
        except (TypeError, ValueError) as e:  # the FFI's answer to arguments it does not take
            raise Unsupported(f"the module's plan rejects the arguments of FlashInfer 0.5.3: "
                              f"{e!r}") from e

    def plan(self, layout: StepLayout, pinned: torch.Tensor) -> LayerCall:
        """Plan a step (its schedule staged in `pinned`, a buffer that no pending copy reads) and
        return the call that runs one layer of it."""
        P = layout.page_size
        inputs = _Inputs(layout, self.backend == "fa3", self.device, self._host)
        plan_info = self._plan_info(inputs, P, pinned, self._iws)
        if self._to_offsets is not None:
            # run's conversion, hoisted out of the layers: every layer's pages have the pool's
            # strides, (P * nkv * hd, nkv * hd, hd, 1), so stride_block // stride_n = P.
            indices = self._to_offsets(inputs.indices, inputs.kv, self._offsets_buf,
                                       inputs.plan_kv, inputs.kv_lens, P, 1, P)
        else:
            indices = inputs.indices
        return self._bind(plan_info, inputs, indices, P)

    def _bind(self, plan_info: Any, inputs: _Inputs, indices: torch.Tensor,
              page_size: int) -> LayerCall:
        """`wrapper.run(q, (k, v), out=o)`'s call of paged_run, all but q, k, v and o fixed.
        cum_seq_lens_kv (run: the wrapper's vector-sparse indptr) and kv_lens_buffer only reach
        the trtllm-gen backend; fa3 reads the KV indptr from its plan and fa2 the paged one."""
        fn = self._run_fn
        indptr = inputs.plan_kv if self.backend == "fa3" else inputs.kv
        head = (self._fws, self._iws, plan_info)
        mid = (inputs.qo, indptr, indices, inputs.last)
        tail = (None,  # lse
                self._mask_mode, self._layout, WINDOW_LEFT, self._enable_pdl,
                None, None,  # custom mask, mask indptr
                self._alibi,
                None, None, None,  # prefix_len_ptr, token_pos_in_items_ptr, max_item_len_ptr
                0.0,  # logits soft cap
                self.sm_scale,
                None, None, None,  # q, k and v scales
                ROPE_SCALE, ROPE_THETA,
                0,  # token_pos_in_items_len
                self._ws_size, self.num_qo_heads, self.num_kv_heads,
                None,  # block tables
                inputs.kv_lens, page_size, inputs.max_q, inputs.max_kv, inputs.batch,
                inputs.qo, indptr,
                None)  # sinks

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
            fn(*head, q, k, v, *mid, out, *tail)

        return call

    # -- the check against the wrapper ------------------------------------------------------------
    def verify(self, wrapper: Any, layout: StepLayout) -> None:
        """Plan `layout` here, into scratch buffers, and compare with what `wrapper.plan` made of
        the same layout just before: the plan info, the schedule staged on the host and the
        device inputs must match exactly. Synchronizes the device (once, at the first plan)."""
        w = wrapper
        ours = _Inputs(layout, self.backend == "fa3", self.device)
        staged = _attr(w, "_pin_memory_int_workspace_buffer")
        scratch = staged.clone()  # pageable: the copy from it completes before plan returns
        scratch_ws = torch.empty_like(self._iws)  # the copy's target, alive until the sync below
        plan_info = self._checked_plan_info(ours, layout.page_size, scratch, scratch_ws)
        if list(plan_info) != list(_attr(w, "_plan_info")):
            raise Unsupported("the module's plan gives another plan info here than in the wrapper")
        if not torch.equal(scratch, staged):
            raise Unsupported("the module's plan stages another schedule here than in the wrapper")
        B = ours.batch
        pairs = [("qo_indptr", ours.qo, _attr(w, "_qo_indptr_buf")),
                 ("kv_indptr", ours.kv, _attr(w, "_paged_kv_indptr_buf")),
                 ("page ids", ours.indices, _attr(w, "_paged_kv_indices_buf")),
                 ("last page lengths", ours.last, _attr(w, "_paged_kv_last_page_len_buf")),
                 ("kv lengths", ours.kv_lens, _attr(w, "_kv_lens_buffer")[:B])]
        if ours.token_offsets:
            pairs.append(("token indptr", ours.plan_kv,
                          _attr(w, "_vector_sparse_indptr_buffer")[: B + 1]))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        del scratch_ws
        for name, mine, theirs in pairs:
            if mine.dtype != theirs.dtype or not torch.equal(mine, theirs):
                raise Unsupported(f"the wrapper's {name} differ from ours")


class DecodeCall:
    """The kernel call of `BatchDecodeWithPagedKVCacheWrapper.run` (CUDA cores, no JIT module,
    NHD), its arguments bound once per plan: the wrapper's `run` re-checks dtypes and shapes and
    unpacks the KV pages on each of a step's layers, which in a mixed step (attention/mixed.py)
    cost more host time than the kernels. The wrapper still plans. Raises Unsupported where the
    wrapper or its module differ from FlashInfer 0.5.3's."""

    def __init__(self, wrapper: Any, num_qo_heads: int, sm_scale: float) -> None:
        w = wrapper
        if _attr(w, "_backend") == "trtllm-gen" or _attr(w, "_use_tensor_cores"):
            raise Unsupported("the decode wrapper runs the prefill kernels (tensor cores)")
        if _attr(w, "_jit_module") is not None:
            raise Unsupported("the decode wrapper runs a custom JIT module")
        if _attr(w, "_kv_layout") != "NHD":
            raise Unsupported(f"KV layout {w._kv_layout}")
        self._wrapper = w
        fi_utils = importlib.import_module("flashinfer.utils")
        self._layout = _attr(fi_utils, "TensorLayout")["NHD"].value
        device = _attr(w, "device")
        self._enable_pdl = bool(_attr(fi_utils, "device_support_pdl")(device))
        self._alibi = _attr(fi_utils, "_get_cache_alibi_slopes_buf")(num_qo_heads, device)
        self.sm_scale = sm_scale
        self._checked: Any = None  # the module whose run was last checked

    def bind(self) -> LayerCall:
        """The call that runs one layer of the wrapper's latest plan."""
        w = self._wrapper
        module = _attr(w, "_cached_module")
        fn = _attr(module, "run")
        if module is not self._checked:  # a module per plan's dtypes and head dims
            if _params(fn) != DECODE_RUN_PARAMS:
                raise Unsupported(f"the decode module's run takes {_params(fn)}, not the "
                                  "parameters of FlashInfer 0.5.3")
            self._checked = module
        head = (_attr(w, "_float_workspace_buffer"), _attr(w, "_int_workspace_buffer"),
                _attr(w, "_plan_info"))
        mid = (_attr(w, "_paged_kv_indptr_buf"), _attr(w, "_paged_kv_indices_buf"),
               _attr(w, "_paged_kv_last_page_len_buf"))
        tail = (None, self._layout, WINDOW_LEFT, self._enable_pdl, self._alibi,
                0.0, self.sm_scale, ROPE_SCALE, ROPE_THETA)  # lse, ..., logits soft cap

        def call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
            fn(*head, q, k, v, *mid, out, *tail)

        return call
