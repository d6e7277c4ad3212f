"""The Helm chart, rendered by Helm's own engine (helm-python-sdk binds Helm's Go SDK), is valid
Kubernetes for the default values and for an external PostgreSQL.

Manifests of the core API are validated against Kubernetes' schemas (kubernetes-validate,
strict: unknown fields refused). prometheus-operator's kinds (ServiceMonitor, PrometheusRule)
have no schema there: they are checked for the fields the operator reads.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import helm_python as helm
import kubernetes_validate
import pytest
import yaml

from .conftest import DEPLOY

CHART = DEPLOY / "helm" / "llmgw"
KUBERNETES = "1.30"
OPERATOR_KINDS = {"ServiceMonitor", "PrometheusRule"}
POSTGRES = {
    "store": {"type": "postgresql", "postgresql": {"url": "postgresql+asyncpg://llmgw:pw@db:5432/llmgw"}}
}
EVERYTHING = {
    "ingress": {"enabled": True, "className": "nginx", "tlsSecretName": "llmgw-tls"},
    "serviceMonitor": {"enabled": True},
    "prometheusRules": {"enabled": True},
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    chart.validate_schema(values)
    files = chart.render(values, name="demo", namespace="llmgw", is_install=True)
    return [
        doc
        for name, text in sorted(files.items())
        if name.endswith(".yaml")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def env_of(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(manifests, "Deployment")
    (init,) = deployment["spec"]["template"]["spec"]["initContainers"]
    return {e["name"]: e for e in init["env"]}


@pytest.mark.parametrize(
    "values",
    [{}, POSTGRES, {**POSTGRES, **EVERYTHING}, EVERYTHING],
    ids=["defaults", "postgresql", "postgresql-everything", "sqlite-everything"],
)
def test_rendered_manifests_are_valid_kubernetes(values: dict[str, Any]) -> None:
    manifests = render(values)
    for manifest in manifests:
        if manifest["kind"] in OPERATOR_KINDS:
            continue
        kubernetes_validate.validate(manifest, KUBERNETES, strict=True)
    assert {"Deployment", "Service", "Secret", "PersistentVolumeClaim", "ConfigMap"} <= {
        m["kind"] for m in manifests
    }


def test_a_manifest_with_a_wrong_field_is_refused() -> None:
    (service, *_) = by_kind(render({}), "Service")
    service["spec"]["prots"] = service["spec"].pop("ports")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(service, KUBERNETES, strict=True)


def test_defaults_keep_sqlite_on_the_volume_and_make_an_admin_token() -> None:
    manifests = render({})
    (secret,) = by_kind(manifests, "Secret")
    assert base64.b64decode(secret["data"]["store-url"]) == b""
    assert len(base64.b64decode(secret["data"]["admin-token"])) >= 16
    (claim,) = by_kind(manifests, "PersistentVolumeClaim")
    (deployment,) = by_kind(manifests, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"


def test_postgresql_url_travels_in_the_secret_never_in_the_pod_spec() -> None:
    manifests = render(POSTGRES)
    (secret,) = by_kind(manifests, "Secret")
    assert base64.b64decode(secret["data"]["store-url"]).decode() == POSTGRES["store"]["postgresql"]["url"]
    assert "pw@db" not in json.dumps(by_kind(manifests, "Deployment"))
    reference = env_of(manifests)["LLMGW_STORE_URL"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": secret["metadata"]["name"], "key": "store-url"}


def test_existing_secrets_are_referenced_not_copied() -> None:
    values = {
        "adminToken": {"existingSecret": "ops-token", "existingSecretKey": "token"},
        "store": {
            "type": "postgresql",
            "postgresql": {"existingSecret": "ops-db", "existingSecretKey": "url"},
        },
    }
    manifests = render(values)
    env = env_of(manifests)
    assert env["LLMGW_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "ops-token", "key": "token"}
    assert env["LLMGW_STORE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "ops-db", "key": "url"}
    assert by_kind(manifests, "Secret") == []


def test_postgresql_without_a_url_is_refused_with_what_to_set() -> None:
    with pytest.raises(
        helm.HelmError, match=r"set store\.postgresql\.url or store\.postgresql\.existingSecret"
    ):
        render({"store": {"type": "postgresql"}})


def test_values_schema_refuses_an_unknown_store_and_a_short_token() -> None:
    chart = helm.Chart.load(CHART)
    with pytest.raises(helm.HelmValuesError, match="store/type"):
        chart.validate_schema({"store": {"type": "mysql"}})
    with pytest.raises(helm.HelmValuesError, match="adminToken/value"):
        chart.validate_schema({"adminToken": {"value": "short"}})


def test_pods_run_unprivileged_with_a_read_only_root() -> None:
    (deployment,) = by_kind(render({}), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in pod["containers"] + pod["initContainers"]:
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_dashboards_ship_as_configmaps_for_grafanas_sidecar() -> None:
    maps = [m for m in by_kind(render({}), "ConfigMap") if m["metadata"]["labels"].get("grafana_dashboard")]
    shipped = {name for m in maps for name in m["data"]}
    assert shipped == {p.name for p in (DEPLOY / "grafana" / "dashboards").glob("*.json")}
    for m in maps:
        for text in m["data"].values():
            assert json.loads(text)["panels"]


def test_operator_resources_carry_what_the_operator_reads() -> None:
    manifests = render(EVERYTHING)
    (monitor,) = by_kind(manifests, "ServiceMonitor")
    (service, _agents) = by_kind(manifests, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    bearer = {"type": "Bearer", "credentials": {"name": "demo-llmgw", "key": "admin-token"}}
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "30s", "authorization": bearer}
    ]
    (rules,) = by_kind(manifests, "PrometheusRule")
    shipped = {rule.get("alert") for group in rules["spec"]["groups"] for rule in group["rules"]} - {None}
    assert {"LlmgwNoLeader", "LlmgwGpuXidCritical", "LlmgwErrorsBudgetBurnFast"} <= shipped


def test_chart_passes_helm_lint() -> None:
    report = helm.lint(CHART, strict=True)
    errors = [m for m in report["messages"] if m["severity"] >= 2]
    assert report["errors"] == [] and errors == []
