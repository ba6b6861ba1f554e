"""The facts the CAPA row of inplace/infra_tags.py rests on, read in CAPA's source as kubelab's ``capa``
wrapper module pins it (the Go module cache, downloaded if missing): a CAPA bump that renames the
annotation, makes additionalTags immutable or stops re-applying tags fails here, not in a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubelab import build
from kubelab.config import Config

from inplace_extension.inplace.infra_tags import PROVIDER_TAGS

CAPA = next(row for row in PROVIDER_TAGS if row.provider == "CAPA")


@pytest.fixture(scope="module")
def capa() -> Path:
    return build.module_source(Config.from_env(), "capa", "sigs.k8s.io/cluster-api-provider-aws/v2")


def test_the_controller_records_applied_tags_in_the_annotation_of_the_table(capa: Path) -> None:
    tags = (capa / "controllers" / "awsmachine_tags.go").read_text()
    assert f'TagsLastAppliedAnnotation = "{CAPA.annotation}"' in tags
    assert "err = svc.UpdateResourceTags(instanceID, created, deleted)" in tags
    assert "r.updateMachineAnnotationJSON(machine, TagsLastAppliedAnnotation, newAnnotation)" in tags
    controller = (capa / "controllers" / "awsmachine_controller.go").read_text()
    # on every reconcile of an instance in a known state, not only at creation
    assert "if machineScope.InstanceIsInKnownState() {\n\t\t_, err = r.ensureTags(" in controller


def test_the_webhook_leaves_additional_tags_out_of_its_immutability_check(capa: Path) -> None:
    webhook = (capa / "api" / "v1beta2" / "awsmachine_webhook.go").read_text()
    assert 'delete(oldAWSMachineSpec, "additionalTags")' in webhook
    assert 'delete(newAWSMachineSpec, "additionalTags")' in webhook
    types = (capa / "api" / "v1beta2" / "awsmachine_types.go").read_text()
    assert f'json:"{CAPA.pointer.lstrip("/")},omitempty"' in types
