"""JSON Schemas generated from the wire models and Settings; ``schemas/`` holds the committed copies.

``python -m inplace_extension.schemas`` (or ``inplace-extension schemas --write schemas``) rewrites them;
``tests/test_schemas.py`` fails when the committed files drift from the code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from inplace_extension.api.discovery import DiscoveryRequest, DiscoveryResponse
from inplace_extension.api.inplace import (
    CanUpdateMachineRequest,
    CanUpdateMachineResponse,
    CanUpdateMachineSetRequest,
    CanUpdateMachineSetResponse,
    UpdateMachineRequest,
    UpdateMachineResponse,
)
from inplace_extension.capabilities_file import CapabilitiesFile
from inplace_extension.runs.inventory import Inventory
from inplace_extension.settings import Settings

REGENERATE_COMMAND = "python -m inplace_extension.schemas  (or: inplace-extension schemas --write schemas)"

# file name -> (model, mode): requests are what we accept, responses what we send
MODELS: dict[str, tuple[type[BaseModel], Literal["validation", "serialization"]]] = {
    "DiscoveryRequest.json": (DiscoveryRequest, "validation"),
    "DiscoveryResponse.json": (DiscoveryResponse, "serialization"),
    "CanUpdateMachineRequest.json": (CanUpdateMachineRequest, "validation"),
    "CanUpdateMachineResponse.json": (CanUpdateMachineResponse, "serialization"),
    "CanUpdateMachineSetRequest.json": (CanUpdateMachineSetRequest, "validation"),
    "CanUpdateMachineSetResponse.json": (CanUpdateMachineSetResponse, "serialization"),
    "UpdateMachineRequest.json": (UpdateMachineRequest, "validation"),
    "UpdateMachineResponse.json": (UpdateMachineResponse, "serialization"),
    "Settings.json": (Settings, "validation"),
    "inventory.schema.json": (
        Inventory,
        "validation",
    ),  # the --inventory file (inplace_extension/runs/inventory.py)
    # the --capabilities-file (inplace_extension/capabilities_file.py)
    "capabilities.schema.json": (CapabilitiesFile, "validation"),
}


def generate() -> dict[str, str]:
    """File name -> schema text (stable: sorted keys, trailing newline)."""
    texts: dict[str, str] = {}
    for name, (model, mode) in MODELS.items():
        schema: dict[str, Any] = {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            **model.model_json_schema(by_alias=True, mode=mode),
        }
        if model is Settings:
            # defaults of path settings depend on $HOME; the schema documents types, not this machine
            for prop in schema.get("properties", {}).values():
                if isinstance(prop.get("default"), str) and prop["default"].startswith("/"):
                    del prop["default"]
        texts[name] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return texts


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generate().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check(directory: Path) -> list[str]:
    """One line per schema file that is missing or differs from what the code generates."""
    drift = []
    for name, text in generate().items():
        path = directory / name
        if not path.is_file():
            drift.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != text:
            drift.append(f"{path}: differs from the models")
    return drift


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "schemas"
    for path in write(directory):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
