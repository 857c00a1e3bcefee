"""upload_columns and Upload: one packed copy gives back exactly the columns torch.tensor would
build."""

from __future__ import annotations

import pytest
import torch
from radixserve.engine.upload import Upload, upload_columns

COLUMNS = [
    ([True, False, True], torch.bool),  # 3 bytes: the next column starts after padding
    ([0.1, 1.0, 1e-45, 3.4e38, -2.5], torch.float32),  # rounding and a subnormal as torch rounds
    ([1e300, -1e300], torch.float32),  # beyond float32: infinite as torch makes it, not an error
    ((True, False), torch.bool),  # a tuple, as a step's sampler options give their columns
    ([2**40 + 1, -7, 0], torch.int64),
    ([], torch.int64),
    ([5, -5], torch.int32),
    ([2**32 - 1] * 9, torch.int64),
    (torch.tensor([3, -4, 5]), torch.int64),  # a cpu tensor as the values
]

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
def test_upload_columns_match_torch_tensor(device):
    dev = torch.device(device)
    got = upload_columns(COLUMNS, dev)
    assert len(got) == len(COLUMNS)
    for (values, dtype), t in zip(COLUMNS, got):
        want = torch.as_tensor(values, dtype=dtype)
        assert t.dtype == dtype and t.shape == want.shape and t.device.type == dev.type
        assert torch.equal(t.cpu(), want)


@pytest.mark.parametrize("device", DEVICES)
def test_every_column_starts_on_16_bytes(device):
    """Triton kernels compile once per alignment of their pointers: a column that starts at any
    8-byte offset would build a new variant of the kernel reading it, mid-run."""
    got = upload_columns(COLUMNS, torch.device(device))
    base = got[0].data_ptr()
    assert all((t.data_ptr() - base) % 16 == 0 for t in got)


def test_each_call_has_its_own_buffer():
    dev = torch.device("cpu")
    first = upload_columns([([1, 2, 3], torch.int64)], dev)[0]
    upload_columns([([9, 9, 9], torch.int64)], dev)
    assert first.tolist() == [1, 2, 3]


def test_no_columns_and_empty_columns():
    dev = torch.device("cpu")
    assert upload_columns([], dev) == []
    (empty,) = upload_columns([([], torch.float32)], dev)
    assert empty.shape == (0,) and empty.dtype == torch.float32


@pytest.mark.parametrize("device", DEVICES)
def test_upload_gives_each_producer_its_columns_from_one_copy(device):
    up = Upload(torch.device(device))
    writes = up.add([(torch.tensor([3, 1]), torch.int64), ([7, 8], torch.int64)])
    nothing = up.add([])
    sampling = up.add([((True, False, True), torch.bool), ([0.5, 2.0, 1.0], torch.float32)])
    up.send()
    assert [t.tolist() for t in up.views(writes)] == [[3, 1], [7, 8]]
    assert up.views(nothing) == []
    flags, temps = up.views(sampling)
    assert flags.tolist() == [True, False, True] and temps.tolist() == [0.5, 2.0, 1.0]
    # one copy: every view lies in one device buffer
    assert len({t.untyped_storage().data_ptr() for t in up.views(slice(None))}) == 1
    with pytest.raises(AssertionError, match="after the upload was sent"):
        up.add([([1], torch.int64)])


def test_views_before_send_are_refused():
    up = Upload(torch.device("cpu"))
    part = up.add([([1], torch.int64)])
    with pytest.raises(AssertionError, match="before the upload was sent"):
        up.views(part)
