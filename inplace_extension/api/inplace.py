"""In-place wire types (``inplaceupdate_types.go``): CanUpdateMachine, CanUpdateMachineSet, UpdateMachine.

Objects are free-form JSON (a RawExtension for providers' kinds; a typed Machine/MachineSet whose spec we
still treat as JSON), with the few metadata fields we rely on validated. ``to_json()`` gives back exactly
the object that was sent, for the pure core.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self, get_args

from pydantic import ConfigDict, Field, model_validator

from inplace_extension.api.common import CommonRequest, CommonResponse, CommonRetryResponse, Patch, WireModel
from inplace_extension.api.go_types import check_objects


class JsonObjectModel(WireModel):
    """A wire model over a JSON object: its fields are JSON values or other ``JsonObjectModel`` s."""

    # (field name, wire name, whether the value may be a JsonObjectModel), set per subclass
    WIRE_FIELDS: ClassVar[tuple[tuple[str, str, bool], ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.WIRE_FIELDS = tuple(
            (name, field.serialization_alias or field.alias or name, _may_hold_model(field.annotation))
            for name, field in cls.model_fields.items()
        )

    def to_json(self) -> dict[str, Any]:
        """The object exactly as received (unset fields stay absent, explicit nulls stay null).

        What ``model_dump(by_alias=True, exclude_unset=True)`` gives, without copying every value: the
        field values (``spec``, labels, unknown fields) are shared with the model, so treat the result as
        read-only, as the pure core does.
        """
        data: dict[str, Any] = {}
        fields_set = self.model_fields_set
        values = self.__dict__
        for name, wire, may_hold_model in self.WIRE_FIELDS:
            if name in fields_set:
                value = values[name]
                if may_hold_model and isinstance(value, JsonObjectModel):
                    value = value.to_json()
                data[wire] = value
        if self.__pydantic_extra__:
            data.update(self.__pydantic_extra__)
        return data


def _may_hold_model(annotation: Any) -> bool:
    """Whether a field annotation names a JsonObjectModel (directly or inside a union or container)."""
    if isinstance(annotation, type) and issubclass(annotation, JsonObjectModel):
        return True
    return any(_may_hold_model(argument) for argument in get_args(annotation))


class ObjectMeta(JsonObjectModel):
    model_config = ConfigDict(extra="allow")

    name: str | None = None
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class NamedObjectMeta(ObjectMeta):
    """Machine/MachineSet metadata: name and namespace key logs and runs (``metadata.uid`` is not sent)."""

    name: str = Field(min_length=1)
    namespace: str = Field(min_length=1)


class KubeObject(JsonObjectModel):
    """A Kubernetes object as CAPI sends it: apiVersion, kind, a metadata subset, spec; anything else kept."""

    model_config = ConfigDict(extra="allow")

    api_version: str | None = None
    kind: str = Field(min_length=1)
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: dict[str, Any] | None = None


class Machine(KubeObject):
    metadata: NamedObjectMeta
    spec: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace}/{self.metadata.name}"


class MachineSet(Machine):
    pass


class RequestObjects(WireModel):
    """The objects of a request (the Machine or MachineSet, its infrastructure and bootstrap objects)."""

    # (field name, wire key) of each object, in the order the core and the Go-type check take them
    OBJECTS: ClassVar[tuple[tuple[str, str], ...]] = ()

    def to_json(self) -> dict[str, Any]:
        """Plain JSON objects keyed by their wire names, as the pure core takes them (absent ones out)."""
        values = self.__dict__
        return {wire: values[name].to_json() for name, wire in self.OBJECTS if values[name] is not None}

    def typed_parts(self) -> dict[str, dict[str, Any]]:
        """What ``check_objects`` reads of each object (apiVersion, kind, spec if sent), keyed as ``to_json``.

        The same answer as from ``to_json()``, without rebuilding each object's JSON first.
        """
        parts = {}
        for name, wire in self.OBJECTS:
            obj: KubeObject | None = self.__dict__[name]
            if obj is not None:
                part: dict[str, Any] = {"apiVersion": obj.api_version, "kind": obj.kind}
                if "spec" in obj.model_fields_set:
                    part["spec"] = obj.spec
                parts[wire] = part
        return parts


class CanUpdateMachineRequestObjects(RequestObjects):
    OBJECTS = (
        ("machine", "machine"),
        ("infrastructure_machine", "infrastructureMachine"),
        ("bootstrap_config", "bootstrapConfig"),
    )

    machine: Machine
    infrastructure_machine: KubeObject
    bootstrap_config: KubeObject | None = None  # optional: absent when the Machine has no bootstrap config


class CanUpdateMachineRequest(CommonRequest):
    KIND = "CanUpdateMachineRequest"

    current: CanUpdateMachineRequestObjects
    desired: CanUpdateMachineRequestObjects

    @model_validator(mode="after")
    def _check_go_types(self) -> Self:
        check_objects(self.current.typed_parts(), "current")
        check_objects(self.desired.typed_parts(), "desired")
        return self


# CAPI v1.15 adds ``affectsAvailability`` to both CanUpdate* responses: false lets it update in place without
# a surge Machine. v1.14's runtime client decodes responses with Go's encoding/json without
# DisallowUnknownFields (internal/runtime/client/client.go), so an older CAPI ignores it.
AFFECTS_AVAILABILITY_DOC = (
    "false when every claimed change is of disruption class none (CAPI v1.15; ignored by older CAPI)"
)


class CanUpdateMachineResponse(CommonResponse):
    kind: str = "CanUpdateMachineResponse"
    machine_patch: Patch | None = None
    infrastructure_machine_patch: Patch | None = None
    bootstrap_config_patch: Patch | None = None
    affects_availability: bool | None = Field(None, description=AFFECTS_AVAILABILITY_DOC)


class CanUpdateMachineSetRequestObjects(RequestObjects):
    OBJECTS = (
        ("machine_set", "machineSet"),
        ("infrastructure_machine_template", "infrastructureMachineTemplate"),
        ("bootstrap_config_template", "bootstrapConfigTemplate"),
    )

    machine_set: MachineSet
    infrastructure_machine_template: KubeObject
    bootstrap_config_template: KubeObject | None = (
        None  # omitted when the MachineSets have no bootstrap.configRef
    )


class CanUpdateMachineSetRequest(CommonRequest):
    KIND = "CanUpdateMachineSetRequest"

    current: CanUpdateMachineSetRequestObjects
    desired: CanUpdateMachineSetRequestObjects

    @model_validator(mode="after")
    def _check_go_types(self) -> Self:
        check_objects(self.current.typed_parts(), "current")
        check_objects(self.desired.typed_parts(), "desired")
        return self


class CanUpdateMachineSetResponse(CommonResponse):
    kind: str = "CanUpdateMachineSetResponse"
    machine_set_patch: Patch | None = None
    infrastructure_machine_template_patch: Patch | None = None
    bootstrap_config_template_patch: Patch | None = None
    affects_availability: bool | None = Field(None, description=AFFECTS_AVAILABILITY_DOC)


class UpdateMachineRequestObjects(CanUpdateMachineRequestObjects):
    """Same shape as the CanUpdateMachine objects: the live objects, already holding the new spec (§6.1)."""


class UpdateMachineRequest(CommonRequest):
    KIND = "UpdateMachineRequest"

    desired: UpdateMachineRequestObjects  # no "current": the extension knows the host's real state itself

    @model_validator(mode="after")
    def _check_go_types(self) -> Self:
        check_objects(self.desired.typed_parts(), "desired")
        return self


class UpdateMachineResponse(CommonRetryResponse):
    kind: str = "UpdateMachineResponse"
