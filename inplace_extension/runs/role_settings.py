"""The settings the shipped roles expose to operators: names, types, ranges, and their Ansible variables.

Set in the capabilities file's ``role_settings`` section (``inplace_extension.capabilities_file``),
checked at start-up, and handed to every play as an extra-vars file (runner.py), so a site can use an
internal mirror, another package source or longer health waits without copying ``playbooks/``. Each
field here is the role's default variable ``<role>_<field>`` (``playbooks/roles/<role>/defaults``);
what a role checks for safety (name and value patterns, paths it owns) is not exposed. Strings are
refused if they hold a template (``{`` ``}`` ``%``): Ansible would render a variable it is handed.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from inplace_extension.validation import described

# http(s) URL without whitespace, quotes or template characters; no trailing slash (the roles add paths)
URL_PATTERN: Final = described(
    r"^https?://[^\s{}%\"'\\]+[^/\s{}%\"'\\]$",
    "an http:// or https:// URL without a trailing slash, blanks, quotes, backslashes or template "
    "characters ({ } %), e.g. https://mirror.example.com/k8s",
)
ABSOLUTE_PATTERN: Final = described(
    r"^/[^\s{}%\"'\\]*$",
    "an absolute path without blanks, quotes, backslashes or template characters ({ } %), e.g. "
    "/etc/apt/keyrings/kubernetes.gpg",
)

# a kubeadm flag as the role takes it ("--flag" or "--flag=value"), without template characters
KUBEADM_ARG_PATTERN: Final = described(
    r"^--[a-z][a-z0-9-]*(=[^\x00-\x1f\x7f{}%]*)?$",
    "a kubeadm flag, --name or --name=value (a lowercase name; no control or template characters "
    "({ } %) in the value), e.g. --ignore-preflight-errors=SystemVerification",
)

Url = Annotated[str, Field(pattern=URL_PATTERN)]
AbsolutePath = Annotated[str, Field(pattern=ABSOLUTE_PATTERN)]


class _Role(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesVersionSettings(_Role):
    """``kubernetes_version``: where kubeadm, kubelet and kubectl come from, and the kubelet's health wait."""

    package_source: Literal["apt", "binary"] | None = Field(
        None, description="apt: the community apt repository; binary: release binaries checked by .sha256"
    )
    apt_repository_base: Url | None = Field(
        None, description='apt repository base, "/<minor>/deb/" is appended (default pkgs.k8s.io)'
    )
    apt_keyring: AbsolutePath | None = Field(None, description="the repository's signing key on the host")
    binary_base_url: Url | None = Field(
        None,
        description='release binaries base URL: "<url>/<version>/bin/linux/<arch>/<binary>" and its '
        ".sha256 (default https://dl.k8s.io/release); an internal mirror goes here",
    )
    bin_dir: AbsolutePath | None = Field(None, description="where the binaries are installed (binary source)")
    kubeadm_upgrade_args: list[Annotated[str, Field(pattern=KUBEADM_ARG_PATTERN)]] | None = Field(
        None,
        max_length=32,
        description='extra flags of "kubeadm upgrade apply|node", e.g. '
        '["--ignore-preflight-errors=SystemVerification"] or ["--patches=/etc/kubernetes/patches"]',
    )
    health_retries: int | None = Field(None, ge=1, le=1000, description="kubelet healthz tries after restart")
    health_delay_seconds: int | None = Field(None, ge=1, le=60, description="seconds between those tries")


class KubeletArgsSettings(_Role):
    """``kubelet_args``: how long the restarted kubelet may take to answer healthz."""

    health_timeout_seconds: int | None = Field(None, ge=1, le=3600)


class KubeletCredentialsSettings(_Role):
    """``kubelet_credentials``: the kubelet's health wait after a credential rotation."""

    health_retries: int | None = Field(None, ge=1, le=1000)
    health_delay_seconds: int | None = Field(None, ge=1, le=60)


class UsersSettings(_Role):
    """``users``: the default of ``lockPassword`` when a user entry leaves it unset."""

    default_lock_password: bool | None = None


class RoleSettings(_Role):
    """The capabilities file's ``role_settings``: per role, the settings to change from its defaults."""

    kubernetes_version: KubernetesVersionSettings = Field(default_factory=KubernetesVersionSettings)
    kubelet_args: KubeletArgsSettings = Field(default_factory=KubeletArgsSettings)
    kubelet_credentials: KubeletCredentialsSettings = Field(default_factory=KubeletCredentialsSettings)
    users: UsersSettings = Field(default_factory=UsersSettings)

    def extra_vars(self) -> dict[str, Any]:
        """The Ansible variables of the settings given (``kubernetes_version_binary_base_url``: ...)."""
        variables: dict[str, Any] = {}
        for role in type(self).model_fields:
            settings: _Role = getattr(self, role)
            for name, value in settings.model_dump(exclude_none=True).items():
                variables[f"{role}_{name}"] = value
        return variables
