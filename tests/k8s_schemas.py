"""Validation of Kubernetes objects against real schemas, shared by the manifest and job-rendering tests.

- Built-in kinds: the Kubernetes OpenAPI schemas of ``kubernetes-validate``, strict (an unknown field fails, as
  ``kubectl apply --validate=strict`` would), for the oldest and the newest Kubernetes the project supports.
- Custom resources: the operators' CRDs as shipped upstream, kept gzipped in ``tests/schemas`` (its README names
  each one's source and checksum), their structural schemas made strict the same way, checked with ``jsonschema``.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parent.parent
# The oldest Kubernetes the manifests must work on, and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ("1.31", kubernetes_validate.latest_version())
SCHEMA_DIR = REPO / "tests" / "schemas"  # the CRDs, gzipped; see its README
PYTORCHJOB_CRD = ("kubeflow.org_pytorchjobs.yaml", "v1")
TRAINJOB_CRD = ("trainer.kubeflow.org_trainjobs.yaml", "v1alpha1")
CLUSTER_TRAINING_RUNTIME_CRD = ("trainer.kubeflow.org_clustertrainingruntimes.yaml", "v1alpha1")
YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # the CRDs are large: libyaml when available


def k8s_errors(obj: dict) -> list[str]:
    """Schema errors of one built-in object, for every Kubernetes version in K8S_VERSIONS."""
    errors = []
    for version in K8S_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = "/".join(str(p) for p in exc.path)
            errors.append(f"{obj['kind']}/{obj['metadata'].get('name')} (k8s {version}) at {path}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError as exc:
            errors.append(exc.message)
    return errors


def pod_template_errors(name: str, template: dict) -> list[str]:
    """A pod template (metadata + spec) against Kubernetes' own PodTemplate schema (stricter than a CRD's copy)."""
    return k8s_errors({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": template})


def forbid_unknown_fields(schema: dict) -> dict:
    """Make a CRD's structural schema reject unknown fields, as ``kubectl apply --validate=strict`` does.

    (The API server silently prunes them otherwise, so a typo in a field name would be lost without an error.)
    """
    if "properties" in schema and "additionalProperties" not in schema \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        schema["additionalProperties"] = False
    for child in schema.get("properties", {}).values():
        forbid_unknown_fields(child)
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            forbid_unknown_fields(schema[key])
    for key in ("allOf", "anyOf", "oneOf"):
        for child in schema.get(key, []):
            forbid_unknown_fields(child)
    return schema


def crd_schema(crd: tuple[str, str]) -> dict:
    """The structural schema of one version of a CRD kept in ``tests/schemas``, as served (a missing file is an
    error)."""
    name, version = crd
    document = yaml.load(gzip.decompress((SCHEMA_DIR / f"{name}.gz").read_bytes()).decode(), Loader=YamlLoader)
    [served] = [v for v in document["spec"]["versions"] if v["name"] == version]
    return served["schema"]["openAPIV3Schema"]


def unknown_fields(schema: dict, obj, path: str = "", prune: bool = False) -> list[str]:
    """The fields of ``obj`` its structural schema does not declare, as the API server names them
    (``spec.trainer.foo``); with ``prune``, also removed from ``obj``, as the server prunes them unless told
    ``fieldValidation=Strict``. ``metadata`` is the server's own (not checked here)."""
    found = []
    if isinstance(obj, dict) and schema.get("type", "object") == "object" \
            and not schema.get("x-kubernetes-preserve-unknown-fields"):
        properties = schema.get("properties")
        values = schema.get("additionalProperties")
        for key in list(obj):
            where = f"{path}.{key}" if path else key
            if where == "metadata":
                continue
            if properties is not None and key in properties:
                found += unknown_fields(properties[key], obj[key], where, prune)
            elif isinstance(values, dict):
                found += unknown_fields(values, obj[key], where, prune)
            elif properties is not None and values is not True:
                found.append(where)
                if prune:
                    del obj[key]
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            found += unknown_fields(schema["items"], item, f"{path}[{i}]", prune)
    return found


def crd_validator(crd: tuple[str, str]) -> jsonschema.protocols.Validator:
    """A strict validator for one version of a CRD kept in ``tests/schemas``."""
    schema = forbid_unknown_fields(crd_schema(crd))
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    cls.check_schema(schema)
    return cls(schema)


def crd_errors(validator: jsonschema.protocols.Validator, obj: dict) -> list[str]:
    return [f"at {'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
