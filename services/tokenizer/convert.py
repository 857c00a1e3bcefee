"""The tokenizer service's one seam between protobuf and its domain jobs."""

from __future__ import annotations

import grpc
from radixserve.internal.common.v1 import common_pb2
from radixserve.internal.tokenizer.v1 import tokenizer_pb2 as pb
from radixserve.services.common.errors import code_number
from radixserve.services.tokenizer.core import (
    Decode,
    EncodeChat,
    EncodeText,
    JobFailure,
    JobKind,
    JobOutcome,
    TokenizerInfo,
)


def job_from_pb(job: pb.Job) -> JobKind | JobFailure:
    kind = job.WhichOneof("kind")
    if kind == "encode_text":
        return EncodeText(job.encode_text.text, job.encode_text.add_special_tokens)
    if kind == "encode_chat":
        chat = job.encode_chat
        return EncodeChat(
            tuple((m.role, m.content) for m in chat.messages), chat.add_generation_prompt
        )
    if kind == "decode":
        return Decode(tuple(job.decode.token_ids), job.decode.skip_special_tokens)
    return JobFailure(grpc.StatusCode.INVALID_ARGUMENT, "job has no kind set")


def jobs_from_pb(msg: pb.ProcessRequest) -> tuple[list[str], list[JobKind | JobFailure]]:
    """(job ids, jobs) of one batch, in order; a job without a kind is a JobFailure."""
    return [job.job_id for job in msg.jobs], [job_from_pb(job) for job in msg.jobs]


def results_to_pb(ids: list[str], outcomes: list[JobOutcome]) -> pb.ProcessResponse:
    return pb.ProcessResponse(results=[result_to_pb(i, out) for i, out in zip(ids, outcomes)])


def result_to_pb(job_id: str, outcome: JobOutcome) -> pb.JobResult:
    if isinstance(outcome, JobFailure):
        status = common_pb2.Status(code=code_number(outcome.code), message=outcome.message)
        return pb.JobResult(job_id=job_id, error=status)
    if isinstance(outcome, str):
        return pb.JobResult(job_id=job_id, text=outcome)
    return pb.JobResult(job_id=job_id, token_ids=common_pb2.TokenIds(ids=outcome))


def info_to_pb(info: TokenizerInfo) -> pb.GetTokenizerInfoResponse:
    return pb.GetTokenizerInfoResponse(
        vocab_size=info.vocab_size,
        has_chat_template=info.has_chat_template,
        special_token_ids=info.special_token_ids,
    )
