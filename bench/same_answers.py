"""Check: the CanUpdate answers of this checkout are byte-identical to another revision's, over many requests.

For speed work on the hook path: generates ``--count`` requests (default 100 000) from the CAPI fixtures
4A/4B (CanUpdateMachine) and 5A/5B (CanUpdateMachineSet), each with one to three random changes from the
agreement test's mutations (tests/inplace/test_agreement.py: version, etcd, feature gates, files, users,
ntp, kubelet args, preKubeadmCommands, infrastructure, failure domain, ignored fields) and, for one in
five, ``requireInPlace``. Both code bases then answer every request through their own ASGI app
(``create_app``, the bytes the server would send), each in its own process with its own sources on
``sys.path``; the answers are compared by SHA-256 and the first difference is printed in full.

    .venv/bin/python bench/same_answers.py [--against main] [--count 100000] [--seed 1]

Exit 0 when every answer is the same, 1 otherwise. ``--against`` is any git revision of this repository.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BASES = {
    "capi/can_update_machine/4A.request.json": "canupdatemachine/can-update-machine",
    "capi/can_update_machine/4B.request.json": "canupdatemachine/can-update-machine",
    "capi/can_update_machine_set/5A.request.json": "canupdatemachineset/can-update-machineset",
    "capi/can_update_machine_set/5B.request.json": "canupdatemachineset/can-update-machineset",
}
PREFIX = "/hooks.runtime.cluster.x-k8s.io/v1alpha1/"


def requests(count: int, seed: int) -> list[tuple[str, bytes]]:
    """(path, body) pairs, the same for the same count and seed."""
    sys.path.insert(0, str(ROOT / "tests"))
    from inplace.support import load, unchanged  # the agreement test's helpers and mutations
    from inplace.test_agreement import MUTATIONS

    rng = random.Random(seed)
    bases = sorted(BASES)
    out = []
    for _ in range(count):
        base = rng.choice(bases)
        request = unchanged(load(base))
        for mutation in rng.sample(MUTATIONS, rng.randint(1, 3)):
            mutation(request, rng)
        if rng.random() < 0.2:
            request["settings"] = {"requireInPlace": "true"}
        out.append((PREFIX + BASES[base], json.dumps(request).encode()))
    return out


def answer_all(bodies: Path, hashes: Path, show: int | None) -> None:
    """Worker: answer every request with the ``inplace_extension`` found first on ``sys.path``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from app.asgi_post import post_scope  # of this checkout, whichever sources answer

    from inplace_extension.app import create_app
    from inplace_extension.settings import Settings

    logging.disable(logging.CRITICAL)  # one decision line per request is not what is compared
    app = create_app(Settings(plain_http=True))

    async def answer(path: str, body: bytes) -> bytes:
        scope = post_scope(path, body)
        chunks: list[bytes] = []
        pending = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            return pending.pop() if pending else {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                chunks.append(str(message["status"]).encode() + b"\n")
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await app(scope, receive, send)  # type: ignore[arg-type]
        return b"".join(chunks)

    async def main() -> None:
        with bodies.open("rb") as src, hashes.open("w") as dst:
            for index, line in enumerate(src):
                path, body = json.loads(line)
                got = await answer(path, body.encode())
                if show is not None and index == show:
                    print(got.decode())
                dst.write(hashlib.sha256(got).hexdigest() + "\n")

    asyncio.run(main())


def run_worker(src: Path, bodies: Path, hashes: Path, show: int | None = None) -> str:
    argv = [sys.executable, __file__, "--worker", str(src), str(bodies), str(hashes)]
    argv += ["--show", str(show)] if show is not None else []
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"same_answers: worker for {src} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--against", default="main", help="git revision to compare with")
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--worker", nargs=3, metavar=("SRC", "BODIES", "HASHES"), help=argparse.SUPPRESS)
    parser.add_argument("--show", type=int, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        src, bodies, hashes = (Path(p) for p in opts.worker)
        import inplace_extension

        if not Path(inplace_extension.__file__).resolve().is_relative_to(src.resolve()):
            raise SystemExit(f"worker imported {inplace_extension.__file__}, not the sources in {src}")
        answer_all(bodies, hashes, opts.show)
        return 0
    with tempfile.TemporaryDirectory(prefix="same-answers-") as tmp:
        work = Path(tmp)
        other = work / "other"
        other.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", opts.against, "inplace_extension"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(other)], input=archive, check=True)
        bodies = work / "bodies.jsonl"
        with bodies.open("w") as out:
            for path, body in requests(opts.count, opts.seed):
                out.write(json.dumps([path, body.decode()]) + "\n")
        results: dict[str, list[str]] = {}
        for name, src in (("this checkout", ROOT), (opts.against, other)):
            run_worker(src, bodies, work / f"{len(results)}.sha")
            results[name] = (work / f"{len(results)}.sha").read_text().splitlines()
        mine, theirs = results.values()
        differ = [i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b]
        same = opts.count - len(differ)
        print(f"{opts.count} requests (seed {opts.seed}): {same} answers identical to {opts.against}")
        if not differ:
            return 0
        first = differ[0]
        print(f"{len(differ)} differ; the first, request {first}:")
        for name, src in (("this checkout", ROOT), (opts.against, other)):
            print(f"--- {name}\n" + run_worker(src, bodies, work / "show.sha", show=first))
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
