from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]
    FINISH_REASON_STOP_TOKEN: _ClassVar[FinishReason]
    FINISH_REASON_STOP_STRING: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_ABORTED: _ClassVar[FinishReason]
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_EOS: FinishReason
FINISH_REASON_STOP_TOKEN: FinishReason
FINISH_REASON_STOP_STRING: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_ABORTED: FinishReason

class RequestOptions(_message.Message):
    __slots__ = ("stop", "include_stop_str", "skip_special_tokens", "subscriber")
    STOP_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    stop: _containers.RepeatedScalarFieldContainer[str]
    include_stop_str: bool
    skip_special_tokens: bool
    subscriber: str
    def __init__(self, stop: _Optional[_Iterable[str]] = ..., include_stop_str: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., subscriber: _Optional[str] = ...) -> None: ...

class RequestSetup(_message.Message):
    __slots__ = ("request_id", "prompt_ids", "options")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[int]
    options: RequestOptions
    def __init__(self, request_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[int]] = ..., options: _Optional[_Union[RequestOptions, _Mapping]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[float] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprob", "top")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TokenOutput(_message.Message):
    __slots__ = ("request_id", "token_ids", "logprobs", "finish_reason", "matched_stop_token", "prompt_tokens", "cached_tokens")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MATCHED_STOP_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    finish_reason: FinishReason
    matched_stop_token: int
    prompt_tokens: int
    cached_tokens: int
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., matched_stop_token: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class ProcessRequest(_message.Message):
    __slots__ = ("aborted_ids", "setups", "outputs", "step_unix_ns", "plain_request_ids", "plain_token_ids")
    ABORTED_IDS_FIELD_NUMBER: _ClassVar[int]
    SETUPS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    STEP_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    aborted_ids: _containers.RepeatedScalarFieldContainer[str]
    setups: _containers.RepeatedCompositeFieldContainer[RequestSetup]
    outputs: _containers.RepeatedCompositeFieldContainer[TokenOutput]
    step_unix_ns: int
    plain_request_ids: _containers.RepeatedScalarFieldContainer[str]
    plain_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, aborted_ids: _Optional[_Iterable[str]] = ..., setups: _Optional[_Iterable[_Union[RequestSetup, _Mapping]]] = ..., outputs: _Optional[_Iterable[_Union[TokenOutput, _Mapping]]] = ..., step_unix_ns: _Optional[int] = ..., plain_request_ids: _Optional[_Iterable[str]] = ..., plain_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ProcessResponse(_message.Message):
    __slots__ = ("abort_ids",)
    ABORT_IDS_FIELD_NUMBER: _ClassVar[int]
    abort_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, abort_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("subscriber",)
    SUBSCRIBER_FIELD_NUMBER: _ClassVar[int]
    subscriber: str
    def __init__(self, subscriber: _Optional[str] = ...) -> None: ...

class Finish(_message.Message):
    __slots__ = ("reason", "stop_string", "stop_token_id", "prompt_tokens", "completion_tokens", "cached_tokens")
    REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_STRING_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    reason: FinishReason
    stop_string: str
    stop_token_id: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    def __init__(self, reason: _Optional[_Union[FinishReason, str]] = ..., stop_string: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_tokens: _Optional[int] = ...) -> None: ...

class RequestDelta(_message.Message):
    __slots__ = ("request_id", "token_ids", "text", "logprobs", "finish")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    text: str
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    finish: Finish
    def __init__(self, request_id: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ..., finish: _Optional[_Union[Finish, _Mapping]] = ...) -> None: ...

class SubscribeResponse(_message.Message):
    __slots__ = ("deltas", "step_unix_ns", "received_unix_ns", "detokenized_unix_ns", "plain_request_ids", "plain_token_ids", "plain_texts")
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    STEP_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PLAIN_TEXTS_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[RequestDelta]
    step_unix_ns: int
    received_unix_ns: int
    detokenized_unix_ns: int
    plain_request_ids: _containers.RepeatedScalarFieldContainer[str]
    plain_token_ids: _containers.RepeatedScalarFieldContainer[int]
    plain_texts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, deltas: _Optional[_Iterable[_Union[RequestDelta, _Mapping]]] = ..., step_unix_ns: _Optional[int] = ..., received_unix_ns: _Optional[int] = ..., detokenized_unix_ns: _Optional[int] = ..., plain_request_ids: _Optional[_Iterable[str]] = ..., plain_token_ids: _Optional[_Iterable[int]] = ..., plain_texts: _Optional[_Iterable[str]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ("live_requests", "subscribers")
    LIVE_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBERS_FIELD_NUMBER: _ClassVar[int]
    live_requests: int
    subscribers: int
    def __init__(self, live_requests: _Optional[int] = ..., subscribers: _Optional[int] = ...) -> None: ...
