"""schemas/ is generated from the code: a drift fails here with the command that regenerates it."""

from __future__ import annotations

import json
from pathlib import Path

from inplace_extension import schemas

SCHEMAS_DIR = Path(__file__).resolve().parent.parent / "schemas"


def test_committed_schemas_match_the_models() -> None:
    drift = schemas.check(SCHEMAS_DIR)
    assert not drift, (
        "schemas/ drifted from the code:\n" + "\n".join(drift) + f"\nregenerate: {schemas.REGENERATE_COMMAND}"
    )


def test_check_reports_a_changed_and_a_missing_file(tmp_path: Path) -> None:
    schemas.write(tmp_path)
    assert schemas.check(tmp_path) == []
    (tmp_path / "Settings.json").write_text("{}\n")
    (tmp_path / "UpdateMachineResponse.json").unlink()
    drift = schemas.check(tmp_path)
    assert any("Settings.json: differs" in line for line in drift)
    assert any("UpdateMachineResponse.json: missing" in line for line in drift)


def test_update_machine_response_schema_requires_retry_after_seconds() -> None:
    schema = json.loads((SCHEMAS_DIR / "UpdateMachineResponse.json").read_text())
    assert "retryAfterSeconds" in schema["required"]
    patch = json.loads((SCHEMAS_DIR / "CanUpdateMachineResponse.json").read_text())["$defs"]["Patch"]
    assert patch["properties"]["patch"]["format"] == "byte"
