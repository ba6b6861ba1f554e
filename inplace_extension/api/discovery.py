"""Discovery wire types (CAPI ``discovery_types.go``)."""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator

from inplace_extension.api.common import (
    API_VERSION,
    CommonResponse,
    FailurePolicy,
    WireModel,
    check_type_meta,
)
from inplace_extension.validation import described

# DNS-1123 label: what CAPI validates handler names against (docs/capi-hooks.md §2.3)
DNS1123_LABEL = described(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    "a DNS label: lowercase letters, digits and - (starting and ending with a letter or digit)",
)


class DiscoveryRequest(WireModel):
    """No settings: DiscoveryRequest does not embed CommonRequest."""

    kind: str | None = None
    api_version: str | None = None

    @model_validator(mode="after")
    def _check_type_meta(self) -> Self:
        check_type_meta(self.kind, self.api_version, "DiscoveryRequest")
        return self


class GroupVersionHook(WireModel):
    api_version: str = API_VERSION
    hook: str


class ExtensionHandler(WireModel):
    name: str = Field(pattern=DNS1123_LABEL, max_length=63)
    request_hook: GroupVersionHook
    timeout_seconds: int | None = Field(default=None, ge=0, le=30)  # CAPI rejects >30; 0/absent means 10
    failure_policy: FailurePolicy | None = None


class DiscoveryResponse(CommonResponse):
    kind: str = "DiscoveryResponse"
    handlers: list[ExtensionHandler] | None = None
