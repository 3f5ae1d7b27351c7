"""Checks on what clients send: every bad value becomes a 4xx with one sentence."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tornado import web

from ..engine.errors import InvalidReference
from ..engine.reference import validate as validate_reference

MAX_BODY_BYTES = 1_000_000
MAX_CONTAINERFILE_BYTES = 256_000


class BadRequest(web.HTTPError):
    def __init__(self, message: str, status: int = 400):
        super().__init__(status, reason=message)
        self.message = message


def json_body(request, limit: int = MAX_BODY_BYTES) -> dict:
    """The request's body as a JSON object (empty: {}); BadRequest when it is too big (413), not JSON or not
    an object."""
    if len(request.body or b"") > limit:
        raise BadRequest(f"the request body is larger than {limit} bytes", 413)
    try:
        data = json.loads(request.body or b"{}")
    except ValueError:
        raise BadRequest("the request body is not valid JSON")
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def string(data: dict, key: str, *, required: bool = True, default: str = "", max_length: int = 4096) -> str:
    """``data[key]`` as a string, checked (length, no NUL); ``default`` when absent or empty and not
    ``required``, else BadRequest."""
    value = data.get(key)
    if value is None or value == "":
        if required:
            raise BadRequest(f"'{key}' is required")
        return default
    if not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string")
    if len(value) > max_length:
        raise BadRequest(f"'{key}' is longer than {max_length} characters")
    if "\0" in value:
        raise BadRequest(f"'{key}' contains a NUL character")
    return value


def image(data: dict, key: str = "image") -> str:
    """``data[key]`` as a valid image reference; BadRequest naming the problem otherwise."""
    value = string(data, key, max_length=512)
    try:
        return validate_reference(value)
    except InvalidReference as err:
        raise BadRequest(str(err))


def boolean(data: dict, key: str, default: bool) -> bool:
    """``data[key]`` if it is JSON true or false (``default`` when absent); BadRequest otherwise."""
    value = data.get(key, default)
    if not isinstance(value, bool):
        raise BadRequest(f"'{key}' must be true or false")
    return value


def integer(data: dict, key: str, *, default: int | None = None, low: int, high: int) -> int:
    """``data[key]`` as a whole number from ``low`` to ``high`` (``default`` when absent); BadRequest
    otherwise."""
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be a whole number")
    if not low <= value <= high:
        raise BadRequest(f"'{key}' must be between {low} and {high}, not {value}")
    return value


def _both_strings(key: object, value: object) -> bool:
    return isinstance(key, str) and isinstance(value, str)


def _breaks_a_line(text: str) -> bool:
    """Whether ``text`` holds a newline or a NUL character."""
    return "\n" in text or "\0" in text


def string_map(data: dict, key: str) -> dict[str, str]:
    """``data[key]`` as an object of strings with no newline or NUL in them (a missing key: {}); BadRequest
    otherwise."""
    value = data.get(key) or {}
    if not isinstance(value, dict) or not all(_both_strings(k, v) for k, v in value.items()):
        raise BadRequest(f"'{key}' must be an object of strings")
    if any(_breaks_a_line(k) or _breaks_a_line(v) for k, v in value.items()):
        raise BadRequest(f"'{key}' has a value with a newline")
    return value


def string_list(data: dict, key: str) -> list[str]:
    """``data[key]`` as a list of strings (a missing key: []); BadRequest otherwise."""
    value = data.get(key) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{key}' must be a list of strings")
    return value


def inside_root(root_dir: str, relative: str, key: str) -> Path:
    """``relative`` (a path as the file browser shows it) resolved inside the server's root.

    Absolute paths, ``..`` and symlinks that lead out of the root are refused.
    """
    if os.path.isabs(relative) or relative.startswith("~"):
        raise BadRequest(f"'{key}' must be a path relative to the server's root directory")
    if ".." in Path(relative).parts:
        raise BadRequest(f"'{key}' must not contain '..'")
    root = Path(root_dir).resolve()
    resolved = (root / relative).resolve()
    if resolved != root and root not in resolved.parents:
        raise BadRequest(f"'{key}' leads outside the server's root directory", 403)
    return resolved
