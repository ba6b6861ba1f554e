"""A signed apt repository of STAND-IN Kubernetes packages, laid out like pkgs.k8s.io (tests only).

pkgs.k8s.io serves one flat repository per minor version: ``<base>/v1.31/deb/`` with ``InRelease``,
``Packages`` and ``Release.key``. :class:`StandinAptRepo` builds the same for the given versions:
``kubeadm``, ``kubelet`` and ``kubectl`` packages (version ``X.Y.Z-1.1``, built with dpkg-deb) whose
only file is the stand-in command from ``standin_files/``, a ``Packages`` index, a ``Release`` file
clear-signed with a throw-away ed25519 key (gpg) and that key as ``Release.key``. It serves them over
HTTP on an address of our choosing (the lab gateway), so the kubernetes_version role's apt path runs
unchanged: key download, ``signed-by`` source, signature check by apt, pinned install, hold.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.server
import os
import subprocess
from pathlib import Path
from typing import Any

from .standins import KUBERNETES_BINARIES, standin_binary
from .support import BackgroundHTTPServer

ARCH = "all"  # the stand-ins are shell scripts


class StandinAptRepo(BackgroundHTTPServer):
    def __init__(self, workdir: Path, versions: list[str], address: str) -> None:
        self.root = workdir / "apt-root"
        self._gnupg = workdir / "gnupg"
        self._gnupg.mkdir(mode=0o700)
        self._gpg("--quick-gen-key", "inplace-extension test repository", "ed25519", "sign", "never")
        for minor in sorted({v.rsplit(".", 1)[0] for v in versions}):
            self._build_minor(minor, [v for v in versions if v.rsplit(".", 1)[0] == minor])
        # gpg started an agent for this key's home; it would outlive the test run
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(self._gnupg)},
            capture_output=True,
            timeout=60,
            check=True,
        )
        self.requests: list[str] = []
        outer = self

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, directory=str(outer.root), **kwargs)

            def do_GET(self) -> None:
                outer.requests.append(self.path)
                super().do_GET()

            def log_message(self, format: str, *args: Any) -> None:
                return

        super().__init__(address, Handler)
        # the role appends "/v1.31/deb/" to this, as to https://pkgs.k8s.io/core:/stable:
        self.base_url = f"{self.origin}/core:/stable:"

    def _gpg(self, *args: str, stdin: bytes | None = None) -> bytes:
        env = {**os.environ, "GNUPGHOME": str(self._gnupg)}
        argv = ["gpg", "--batch", "--quiet", "--pinentry-mode", "loopback", "--passphrase", "", *args]
        proc = subprocess.run(argv, input=stdin, capture_output=True, env=env, timeout=60, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"gpg {' '.join(args)} failed: {proc.stderr.decode(errors='replace')}")
        return proc.stdout

    def _build_minor(self, minor: str, versions: list[str]) -> None:
        repo = self.root / "core:" / "stable:" / minor / "deb"
        repo.mkdir(parents=True)
        stanzas = []
        for version in versions:
            for name in KUBERNETES_BINARIES:
                stanzas.append(self._build_deb(repo, name, version))
        packages = "\n".join(stanzas).encode()
        (repo / "Packages").write_bytes(packages)
        release = (
            f"Origin: inplace-extension tests\nLabel: stand-in kubernetes {minor}\n"
            f"Date: {email.utils.formatdate(usegmt=True)}\nArchitectures: amd64 arm64 {ARCH}\n"
            f"SHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
        )
        (repo / "Release").write_text(release)
        (repo / "InRelease").write_bytes(self._gpg("--clearsign", stdin=release.encode()))
        (repo / "Release.key").write_bytes(self._gpg("--armor", "--export"))

    def _build_deb(self, repo: Path, name: str, version: str) -> str:
        debian_version = f"{version.lstrip('v')}-1.1"  # pkgs.k8s.io style
        tree = repo.parent / f"build-{name}-{debian_version}"
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "usr" / "bin").mkdir(parents=True)
        binary = tree / "usr" / "bin" / name
        binary.write_bytes(standin_binary(name, version))
        binary.chmod(0o755)
        control = (
            f"Package: {name}\nVersion: {debian_version}\nArchitecture: {ARCH}\n"
            f"Maintainer: inplace-extension tests <tests@invalid>\n"
            f"Description: STAND-IN {name} for lab tests, not Kubernetes\n"
        )
        (tree / "DEBIAN" / "control").write_text(control)
        deb = repo / f"{name}_{debian_version}_{ARCH}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", "--build", str(tree), str(deb)],
            capture_output=True,
            check=True,
            timeout=60,
        )
        data = deb.read_bytes()
        # the index stanza: the control fields plus where the package is and its size and digest
        where = f"Filename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n"
        return control.replace("Description:", where + "Description:")
