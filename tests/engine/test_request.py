"""Which running requests decode a step (`split_running`): the rule the scheduler reads for every
running request each step."""

from __future__ import annotations

from radixserve.engine.request import Req, ReqStatus, split_running
from radixserve.engine.sampling.params import SamplingParams


def _req(name: str, device_len: int, outputs: int, max_new: int = 8,
         constrained: bool = False) -> Req:
    r = Req(name, [1, 2, 3, 4], SamplingParams(max_new_tokens=max_new), max_new, 0)
    r.status, r.device_len, r.output_ids = ReqStatus.RUNNING, device_len, [7] * outputs
    if constrained:
        r.grammar = object()  # type: ignore[assignment]  # only its presence is read
    return r


def test_running_requests_split_into_decodes_and_prefills_in_order() -> None:
    prefilling = _req("prefilling", device_len=3, outputs=0)  # prompt of 4 not all launched
    last_chunk = _req("last chunk", device_len=4, outputs=0)  # device_len == fill_len: still
    decoding = _req("decoding", device_len=6, outputs=1)  # 2 scheduled, 1 known (overlap)
    done = _req("done", device_len=12, outputs=7)  # all 8 outputs scheduled
    waiting = _req("grammar waits", device_len=6, outputs=1, constrained=True)
    ready = _req("grammar ready", device_len=6, outputs=2, constrained=True)
    finished = _req("finished", device_len=6, outputs=2)
    finished.status = ReqStatus.FINISHED
    reqs = [prefilling, decoding, last_chunk, done, waiting, ready, finished]
    decodes, prefills = split_running(reqs)
    assert [r.rid for r in decodes] == ["decoding", "grammar ready"]
    assert [r.rid for r in prefills] == ["prefilling", "last chunk"]
