"""The part of ``kustomize build`` that deploy/ uses, so its overlays render offline in tests.

Supported: ``resources`` (files and directories), ``configMapGenerator`` with ``files`` and
``generatorOptions.disableNameSuffixHash``, and ``patches`` given by ``path`` as strategic-merge
patches (maps merged key by key, a key set to null deleted, lists of named items merged by
``name``, other lists replaced).
Anything else in a kustomization is an error here rather than silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]
SUPPORTED = {"apiVersion", "kind", "resources", "patches", "configMapGenerator", "generatorOptions"}


class KustomizeError(ValueError):
    """A kustomization this renderer does not understand, or a patch with no target."""


def build(directory: Path) -> list[Resource]:
    """The resources ``kustomize build directory`` would print, in order."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(spec) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}: unsupported kustomization fields {sorted(unknown)}")
    out: list[Resource] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        if path.is_dir():
            out.extend(build(path))
        else:
            out.extend(doc for doc in yaml.safe_load_all(path.read_text()) if doc)
    if spec.get("configMapGenerator") and not spec.get("generatorOptions", {}).get(
        "disableNameSuffixHash"
    ):
        raise KustomizeError(f"{directory}: name-hashed ConfigMaps are not supported here")
    for generator in spec.get("configMapGenerator", []):
        data = {}
        for item in generator["files"]:
            key, _, source = item.rpartition("=") if "=" in item else ("", "", item)
            data[key or Path(source).name] = (directory / source).read_text()
        out.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": generator["name"]},
                "data": data,
            }
        )
    for patch in spec.get("patches", []):
        if set(patch) != {"path"}:
            raise KustomizeError(f"{directory}: only `patches: - path: FILE` is supported")
        for doc in yaml.safe_load_all((directory / patch["path"]).read_text()):
            target = next(
                (
                    r
                    for r in out
                    if r["kind"] == doc["kind"] and r["metadata"]["name"] == doc["metadata"]["name"]
                ),
                None,
            )
            if target is None:
                raise KustomizeError(f"{patch['path']}: no {doc['kind']} {doc['metadata']['name']}")
            merge(target, doc)
    return out


def merge(base: Any, patch: Any) -> Any:
    """Strategic merge of ``patch`` into ``base`` (in place for maps); returns the result."""
    if isinstance(base, dict) and isinstance(patch, dict):
        for key, value in patch.items():
            if value is None:
                base.pop(key, None)
            else:
                base[key] = merge(base[key], value) if key in base else value
        return base
    if _named(base) and _named(patch):
        by_name = {item["name"]: item for item in base}
        for item in patch:
            if item["name"] in by_name:
                merge(by_name[item["name"]], item)
            else:
                base.append(item)
        return base
    return patch


def _named(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, dict) and "name" in i for i in value)
