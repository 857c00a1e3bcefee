from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RowTarget(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROW_TARGET_UNSPECIFIED: _ClassVar[RowTarget]
    ROW_TARGET_PAGE_TABLE: _ClassVar[RowTarget]
    ROW_TARGET_TOKEN_POOL: _ClassVar[RowTarget]
ROW_TARGET_UNSPECIFIED: RowTarget
ROW_TARGET_PAGE_TABLE: RowTarget
ROW_TARGET_TOKEN_POOL: RowTarget

class StepPlan(_message.Message):
    __slots__ = ("seq", "shutdown", "bindings", "writes", "rows", "grammar")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    BINDINGS_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    shutdown: bool
    bindings: _containers.RepeatedCompositeFieldContainer[SlotBinding]
    writes: _containers.RepeatedCompositeFieldContainer[RowWrite]
    rows: BatchRows
    grammar: GrammarMask
    def __init__(self, seq: _Optional[int] = ..., shutdown: _Optional[bool] = ..., bindings: _Optional[_Iterable[_Union[SlotBinding, _Mapping]]] = ..., writes: _Optional[_Iterable[_Union[RowWrite, _Mapping]]] = ..., rows: _Optional[_Union[BatchRows, _Mapping]] = ..., grammar: _Optional[_Union[GrammarMask, _Mapping]] = ...) -> None: ...

class GrammarMask(_message.Message):
    __slots__ = ("rows", "bits")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedScalarFieldContainer[int]
    bits: bytes
    def __init__(self, rows: _Optional[_Iterable[int]] = ..., bits: _Optional[bytes] = ...) -> None: ...

class SlotBinding(_message.Message):
    __slots__ = ("slot", "prompt_len", "seed", "sampling")
    SLOT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LEN_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    slot: int
    prompt_len: int
    seed: int
    sampling: SamplingOptions
    def __init__(self, slot: _Optional[int] = ..., prompt_len: _Optional[int] = ..., seed: _Optional[int] = ..., sampling: _Optional[_Union[SamplingOptions, _Mapping]] = ...) -> None: ...

class SamplingOptions(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "min_p", "min_new_tokens", "stop_token_ids", "ignore_eos", "repetition_penalty", "frequency_penalty", "presence_penalty", "top_logprobs", "logprobs")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    min_new_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    ignore_eos: bool
    repetition_penalty: float
    frequency_penalty: float
    presence_penalty: float
    top_logprobs: int
    logprobs: bool
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., min_p: _Optional[float] = ..., min_new_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., ignore_eos: _Optional[bool] = ..., repetition_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., top_logprobs: _Optional[int] = ..., logprobs: _Optional[bool] = ...) -> None: ...

class RowWrite(_message.Message):
    __slots__ = ("target", "slot", "start", "values")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SLOT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    target: RowTarget
    slot: int
    start: int
    values: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, target: _Optional[_Union[RowTarget, str]] = ..., slot: _Optional[int] = ..., start: _Optional[int] = ..., values: _Optional[_Iterable[int]] = ...) -> None: ...

class BatchRows(_message.Message):
    __slots__ = ("slots", "prefix_lens", "seq_lens", "sample")
    SLOTS_FIELD_NUMBER: _ClassVar[int]
    PREFIX_LENS_FIELD_NUMBER: _ClassVar[int]
    SEQ_LENS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    slots: _containers.RepeatedScalarFieldContainer[int]
    prefix_lens: _containers.RepeatedScalarFieldContainer[int]
    seq_lens: _containers.RepeatedScalarFieldContainer[int]
    sample: _containers.RepeatedScalarFieldContainer[bool]
    def __init__(self, slots: _Optional[_Iterable[int]] = ..., prefix_lens: _Optional[_Iterable[int]] = ..., seq_lens: _Optional[_Iterable[int]] = ..., sample: _Optional[_Iterable[bool]] = ...) -> None: ...
