"""HostBuffers: host memory for a step's asynchronous copies, reused two takes later."""

from __future__ import annotations

import torch
from radixserve.engine.host_buffers import HostBuffers


def test_a_buffer_comes_back_two_takes_later() -> None:
    buffers = HostBuffers(pin=False)
    first, second, third = (buffers.take(64) for _ in range(3))
    assert first.data_ptr() != second.data_ptr()
    assert third.data_ptr() == first.data_ptr()  # the step after next writes it again
    assert [len(b) for b in (first, second, third)] == [64, 64, 64]
    assert first.dtype == torch.uint8


def test_a_larger_take_replaces_the_buffer_and_leaves_older_views_intact() -> None:
    buffers = HostBuffers(pin=False)
    small = buffers.take(16)
    small[:] = 7
    buffers.take(16)
    large = buffers.take(40)  # the first buffer's turn, too small: a new one
    assert large.data_ptr() != small.data_ptr() and len(large) == 40
    large[:] = 1
    assert small.tolist() == [7] * 16  # still the old memory, kept alive by the view
    buffers.take(16)
    assert buffers.take(32).data_ptr() == large.data_ptr()  # fits: kept


def test_a_grown_buffer_doubles_so_slowly_growing_takes_reallocate_rarely() -> None:
    buffers = HostBuffers(pin=False, turns=1)
    pointers = {buffers.take(n).data_ptr() for n in range(100, 1700, 10)}
    assert len(pointers) <= 6  # 100 -> 200 -> 400 -> 800 -> 1600 -> 3200


def test_pack_rows_pads_each_row_with_its_fill() -> None:
    buffers = HostBuffers(pin=False)
    rows = buffers.pack_rows([[5, 9], [100, 200], [1, 1]], 4, (0, 1, 0))
    assert rows.dtype == torch.int64 and rows.shape == (3, 4)
    assert rows.tolist() == [[5, 9, 0, 0], [100, 200, 1, 1], [1, 1, 0, 0]]
    # the same buffer two takes later: what the last pack left there is overwritten, padding too
    buffers.pack_rows([[0]], 1, (0,))
    again = buffers.pack_rows([[3], [4], [2**40]], 4, (-1, -1, -1))
    assert again.tolist() == [[3, -1, -1, -1], [4, -1, -1, -1], [2**40, -1, -1, -1]]


def test_pack_rows_fills_a_row_with_no_values() -> None:
    rows = HostBuffers(pin=False).pack_rows([[], []], 3, (0, 1))
    assert rows.tolist() == [[0, 0, 0], [1, 1, 1]]


def test_receive_copies_tensors_of_mixed_dtypes_into_one_buffer() -> None:
    buffers = HostBuffers(pin=False)
    tokens = torch.tensor([3, 1, 4], dtype=torch.int64)
    logprobs = torch.tensor([-0.5, -1.25, -2.0])  # 12 bytes: the next one starts at 8k
    top_ids = torch.arange(6, dtype=torch.int64).reshape(3, 2)
    top_lp = torch.linspace(-3, 0, 9).reshape(3, 3)[:, :2]  # not contiguous
    got = buffers.receive([tokens, logprobs, top_ids, top_lp])
    for want, host in zip([tokens, logprobs, top_ids, top_lp], got):
        assert host.dtype == want.dtype and host.shape == want.shape
        assert torch.equal(host, want)
        assert host.data_ptr() != want.data_ptr()  # a copy, not the device tensor itself
        assert host.data_ptr() % 8 == 0
    base = got[0].data_ptr()
    assert {t.data_ptr() - base for t in got} == {0, 24, 40, 88}
    buffers.receive([tokens])
    buffers.receive([torch.zeros(3, dtype=torch.int64)])  # two takes on: the same memory
    assert got[0].tolist() == [0, 0, 0]


class _Wrapper:
    """A stand-in FlashInfer wrapper: its plan reads the staging buffer it is given."""

    def __init__(self) -> None:
        self._pin_memory_int_workspace_buffer = torch.zeros(64, dtype=torch.uint8)
        self.staged: list[torch.Tensor] = []

    def plan(self, *args: object, **kwargs: object) -> None:
        self.staged.append(self._pin_memory_int_workspace_buffer)


def test_a_flashinfer_plan_stages_in_two_buffers_in_turn() -> None:
    from radixserve.engine.attention.flashinfer_backend import _Planner

    wrapper = _Wrapper()
    planner = _Planner(wrapper)
    for _ in range(3):
        planner.plan()
    first, second, third = wrapper.staged
    assert [b.shape for b in wrapper.staged] == [(64,)] * 3
    assert all(b.dtype == torch.uint8 for b in wrapper.staged)
    # a plan's copy may still be pending while the next step plans: never the same buffer twice
    # in a row, and the step after next has it again
    assert first.data_ptr() != second.data_ptr()
    assert third.data_ptr() == first.data_ptr()
