"""Common wire types (CAPI ``common_types.go``): settings, status, Common*Response, the base64 ``Patch``."""

from __future__ import annotations

import base64
import binascii
import enum
import json
from typing import Annotated, Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator, WithJsonSchema, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from inplace_extension.errors import InvalidRequest

API_VERSION = "hooks.runtime.cluster.x-k8s.io/v1alpha1"


class WireModel(BaseModel):
    """Base of every wire model: camelCase on the wire, unknown fields ignored (as Go's decoder does)."""

    model_config = ConfigDict(
        extra="ignore",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    def to_wire(self) -> bytes:
        """The JSON CAPI receives: camelCase, absent optionals left out (CAPI's ``omitempty``)."""
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


class ResponseStatus(enum.StrEnum):
    SUCCESS = "Success"
    FAILURE = "Failure"


class PatchType(enum.StrEnum):
    JSON_PATCH = "JSONPatch"
    JSON_MERGE_PATCH = "JSONMergePatch"


class FailurePolicy(enum.StrEnum):
    FAIL = "Fail"
    IGNORE = "Ignore"


def _decode_base64(value: object) -> bytes:
    # Go's encoding/json only accepts standard padded base64 for []byte (docs/capi-hooks.md §3.3)
    if isinstance(value, bytes):
        return value
    if not isinstance(value, str):
        raise PydanticCustomError("base64_type", "must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise PydanticCustomError("base64", "must be standard padded base64") from None


def _encode_base64(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


Base64Bytes = Annotated[
    bytes,
    PlainValidator(_decode_base64),
    PlainSerializer(_encode_base64, return_type=str),
    WithJsonSchema({"type": "string", "format": "byte", "contentEncoding": "base64"}),
]


# what json.dumps(..., separators=(",", ":"), ensure_ascii=False, allow_nan=False) uses, built once
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


class Patch(WireModel):
    """One patch for one object: ``patch`` is the patch document as standard padded base64 on the wire."""

    patch_type: PatchType
    patch: Base64Bytes

    @classmethod
    def json_patch(cls, operations: list[dict[str, Any]]) -> Patch:
        """An RFC 6902 patch from its operations (compact JSON, as CAPI's own examples)."""
        document = _COMPACT_JSON.encode(operations)
        return cls(patch_type=PatchType.JSON_PATCH, patch=document.encode())

    def document(self) -> Any:
        """The decoded patch document (a list of operations, or a merge-patch object)."""
        return json.loads(self.patch)


def check_type_meta(kind: str | None, api_version: str | None, expected_kind: str) -> None:
    """A request's ``kind``/``apiVersion`` must be the hook's when given (CAPI always sets both, §1.2).

    A body for another hook (or another API version) posted to this path is refused rather than read as
    this hook's request. Absent values are accepted, as the Go SDK's own server accepts them.
    """
    if kind is not None and kind != expected_kind:
        raise InvalidRequest("kind", f"must be {expected_kind} for this hook")
    if api_version is not None and api_version != API_VERSION:
        raise InvalidRequest("apiVersion", f"must be {API_VERSION}")


class CommonRequest(WireModel):
    KIND: ClassVar[str] = ""  # the hook's request kind, set by each request class

    kind: str | None = None
    api_version: str | None = None
    settings: dict[str, str] | None = None  # ExtensionConfig spec.settings; absent when empty (§3.1)

    @model_validator(mode="after")
    def _check_type_meta(self) -> Self:
        # InvalidRequest is not a ValueError: pydantic lets it through unchanged, with its field path
        check_type_meta(self.kind, self.api_version, self.KIND)
        return self


class CommonResponse(WireModel):
    # kind/apiVersion are optional for CAPI (never checked, §1.2); set for tidiness by each response class
    kind: str = ""
    api_version: str = API_VERSION
    status: ResponseStatus
    message: str | None = None


class CommonRetryResponse(CommonResponse):
    # the schema documents what we send: retryAfterSeconds always (a default alone would make it optional)
    model_config = ConfigDict(json_schema_extra={"required": ["status", "retryAfterSeconds"]})

    # required on the wire, no omitempty: 0 = done, >0 = call again after N seconds (docs/capi-hooks.md §6.4)
    retry_after_seconds: int = 0
