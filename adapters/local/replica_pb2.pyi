from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data", "scalar")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    SCALAR_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    scalar: bool
    def __init__(self, dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ..., scalar: _Optional[bool] = ...) -> None: ...

class Error(_message.Message):
    __slots__ = ("type", "message", "attrs_json")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ATTRS_JSON_FIELD_NUMBER: _ClassVar[int]
    type: str
    message: str
    attrs_json: str
    def __init__(self, type: _Optional[str] = ..., message: _Optional[str] = ..., attrs_json: _Optional[str] = ...) -> None: ...

class ValueList(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class ValueMap(_message.Message):
    __slots__ = ("entries",)
    class EntriesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.MessageMap[str, Value]
    def __init__(self, entries: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("tensor", "str", "raw", "json", "error", "list", "map")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    STR_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    MAP_FIELD_NUMBER: _ClassVar[int]
    tensor: Tensor
    str: str
    raw: bytes
    json: str
    error: Error
    list: ValueList
    map: ValueMap
    def __init__(self, tensor: _Optional[_Union[Tensor, _Mapping]] = ..., str: _Optional[str] = ..., raw: _Optional[bytes] = ..., json: _Optional[str] = ..., error: _Optional[_Union[Error, _Mapping]] = ..., list: _Optional[_Union[ValueList, _Mapping]] = ..., map: _Optional[_Union[ValueMap, _Mapping]] = ...) -> None: ...

class PredictRequest(_message.Message):
    __slots__ = ("inputs",)
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, inputs: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class PredictResponse(_message.Message):
    __slots__ = ("outputs", "batch_error", "service_s")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    BATCH_ERROR_FIELD_NUMBER: _ClassVar[int]
    SERVICE_S_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[Value]
    batch_error: Error
    service_s: float
    def __init__(self, outputs: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., batch_error: _Optional[_Union[Error, _Mapping]] = ..., service_s: _Optional[float] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("pid", "busy")
    PID_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    pid: int
    busy: bool
    def __init__(self, pid: _Optional[int] = ..., busy: _Optional[bool] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class InfoResponse(_message.Message):
    __slots__ = ("model", "replica", "pid", "stats_json")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    STATS_JSON_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica: str
    pid: int
    stats_json: str
    def __init__(self, model: _Optional[str] = ..., replica: _Optional[str] = ..., pid: _Optional[int] = ..., stats_json: _Optional[str] = ...) -> None: ...
