"""The REST API's OpenAPI document (docs/reference/openapi.yaml) against the real handlers' routes
(server/handlers.py ROUTES): every route and method the server answers is documented, nothing else is,
and every path parameter is declared."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from jupyter_podman_hpc.server.handlers import ROUTES

DOCUMENT = Path(__file__).resolve().parents[3] / "docs" / "reference" / "openapi.yaml"
METHODS = ("get", "post", "put", "patch", "delete")


def served() -> set[tuple[str, str]]:
    """(path with each regex group as ``{}``, method) for every method a route's handler defines."""
    found = set()
    for pattern, handler in ROUTES:
        path = "/" + re.sub(r"\([^)]*\)", "{}", pattern)
        found |= {(path, method) for method in METHODS if method in vars(handler)}
    return found


def documented(paths: dict) -> set[tuple[str, str]]:
    """(path with each ``{name}`` as ``{}``, method) for every operation of the document."""
    return {
        (re.sub(r"\{[^}]*\}", "{}", path), method)
        for path, item in paths.items()
        for method in METHODS
        if method in item
    }


def undeclared_parameters(paths: dict, components: dict) -> list[str]:
    """``path method name`` of each ``{name}`` in a path that neither the path nor the operation declares."""

    def names(parameters: list) -> set[str]:
        resolved = [components["parameters"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p for p in parameters]
        return {p["name"] for p in resolved if p["in"] == "path"}

    missing = []
    for path, item in paths.items():
        for method in (m for m in METHODS if m in item):
            declared = names(item.get("parameters", [])) | names(item[method].get("parameters", []))
            missing += [f"{path} {method} {name}" for name in re.findall(r"\{([^}]*)\}", path) if name not in declared]
    return missing


def test_the_document_lists_exactly_the_routes_and_methods_the_server_answers():
    document = yaml.safe_load(DOCUMENT.read_text())
    assert documented(document["paths"]) == served()


def test_every_path_parameter_is_declared():
    document = yaml.safe_load(DOCUMENT.read_text())
    assert undeclared_parameters(document["paths"], document["components"]) == []
