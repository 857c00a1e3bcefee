from radixserve.internal.common.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class EncodeText(_message.Message):
    __slots__ = ("text", "add_special_tokens")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    text: str
    add_special_tokens: bool
    def __init__(self, text: _Optional[str] = ..., add_special_tokens: _Optional[bool] = ...) -> None: ...

class EncodeChat(_message.Message):
    __slots__ = ("messages", "add_generation_prompt")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ...) -> None: ...

class Decode(_message.Message):
    __slots__ = ("token_ids", "skip_special_tokens")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_special_tokens: bool
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., skip_special_tokens: _Optional[bool] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "encode_text", "encode_chat", "decode")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    ENCODE_TEXT_FIELD_NUMBER: _ClassVar[int]
    ENCODE_CHAT_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    encode_text: EncodeText
    encode_chat: EncodeChat
    decode: Decode
    def __init__(self, job_id: _Optional[str] = ..., encode_text: _Optional[_Union[EncodeText, _Mapping]] = ..., encode_chat: _Optional[_Union[EncodeChat, _Mapping]] = ..., decode: _Optional[_Union[Decode, _Mapping]] = ...) -> None: ...

class JobResult(_message.Message):
    __slots__ = ("job_id", "token_ids", "text", "error")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    job_id: str
    token_ids: _common_pb2.TokenIds
    text: str
    error: _common_pb2.Status
    def __init__(self, job_id: _Optional[str] = ..., token_ids: _Optional[_Union[_common_pb2.TokenIds, _Mapping]] = ..., text: _Optional[str] = ..., error: _Optional[_Union[_common_pb2.Status, _Mapping]] = ...) -> None: ...

class ProcessRequest(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class ProcessResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[JobResult]
    def __init__(self, results: _Optional[_Iterable[_Union[JobResult, _Mapping]]] = ...) -> None: ...

class GetTokenizerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetTokenizerInfoResponse(_message.Message):
    __slots__ = ("vocab_size", "has_chat_template", "special_token_ids")
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    HAS_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    SPECIAL_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    vocab_size: int
    has_chat_template: bool
    special_token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, vocab_size: _Optional[int] = ..., has_chat_template: _Optional[bool] = ..., special_token_ids: _Optional[_Iterable[int]] = ...) -> None: ...
