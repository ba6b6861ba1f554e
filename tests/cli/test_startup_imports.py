"""What ``inplace-extension attempt`` imports at start-up: a Job of the ``kubernetes`` executor is that one
process, so every module it loads is paid for by every update (bench/README.md, issue 43 item 3). The
program's parser loads every command's module; what only another command runs (the server, the engine,
the MCM agent, the preview, the schemas, the HTTP client of ``call``) or what only some attempts use (a
capabilities file, its HTTP health checks, CEL, the AWS tags) is imported when it is used."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import ROOT

# what a Job's process must not load before its play: module -> who needs it instead
NOT_AT_START = {
    "uvicorn": "serve",
    "starlette.applications": "serve (the app)",
    "inplace_extension.app": "serve",
    "inplace_extension.engine": "serve, plan",
    "inplace_extension.tls": "serve (its certificate)",
    "inplace_extension.mcm.main": "mcm-agent",
    "inplace_extension.preview.judge": "plan",
    "inplace_extension.schemas": "schemas",
    "inplace_extension.capabilities_file": "an attempt with a capabilities file",
    "httpx": "call, a capabilities file's HTTP health checks",
    "celpy": "a capabilities file's CEL expressions",
    "boto3": "the MCM agent's AWS tags",
}

PARSE_ATTEMPT = """
import json, sys
from inplace_extension.cli import build_parser
args = build_parser().parse_args(["attempt", "--spec", "spec.json"])
assert args.command == "attempt", args
print(json.dumps(sorted(sys.modules)))
"""


def test_the_attempt_command_starts_without_what_other_commands_run() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PARSE_ATTEMPT],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout))
    # the attempt's own modules are loaded (the check looks at the right process)
    assert {"inplace_extension.cli.attempt", "inplace_extension.kubejobs.attempt", "ansible_runner"} <= loaded
    found = {module: needed_by for module, needed_by in NOT_AT_START.items() if module in loaded}
    assert found == {}, f"imported at the attempt's start-up, though only these use them: {found}"
