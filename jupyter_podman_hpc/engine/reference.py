"""Image references: parsing, validation and the names podman may store them under."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InvalidReference

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_REFERENCE = re.compile(
    rf"^(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    r"(?::(?P<tag>[\w][\w.-]{0,127}))?(?:@(?P<digest>sha256:[a-f0-9]{64}))?$"
)
_IMAGE_ID = re.compile(r"^(?:sha256:)?[a-f0-9]{3,64}$")
# Transports that only say where a reference points (a registry, the local storage):
# podman stores the image under the name without them.
_TRANSPORTS = ("docker://", "containers-storage:")


@dataclass(frozen=True)
class Reference:
    domain: str
    path: str
    tag: str
    digest: str

    @property
    def name(self) -> str:
        """The fully qualified name with tag (podman's stored form)."""
        text = f"{self.domain}/{self.path}"
        if self.digest:
            return f"{text}@{self.digest}"
        return f"{text}:{self.tag or 'latest'}"

    def __str__(self) -> str:
        return self.name


def normalize(text: str) -> str:
    """``text`` without a ``docker://`` or ``containers-storage:`` transport prefix.

    ``podman pull docker://REGISTRY/NAME:TAG`` stores REGISTRY/NAME:TAG: every
    entry point (pull, migrate, run, the magics, REST, jobs, kernels) names the
    image so, or a squash after a pull would not find what was pulled.
    """
    for prefix in _TRANSPORTS:
        if isinstance(text, str) and text.startswith(prefix):
            return text[len(prefix) :]
    return text


def parse(text: str) -> Reference:
    """Parse a reference; short names get podman's ``localhost/`` domain."""
    text = _checked_text(normalize(text))
    match = _REFERENCE.match(text)
    if not match:
        raise InvalidReference(f"invalid image reference {text!r}: use [registry/]name[:tag][@digest]")
    domain, path = _registry_and_path(text, match.group("domain"), match.group("path"))
    return Reference(domain, path, match.group("tag") or "", match.group("digest") or "")


def _checked_text(text: str) -> str:
    """``text`` if it can be a reference at all (a non-empty, bounded string without outer blanks)."""
    if not isinstance(text, str) or not text or len(text) > 512 or text != text.strip():
        raise InvalidReference(f"invalid image reference {text!r}")
    return text


def _names_a_registry(domain: str) -> bool:
    """Whether a reference's first part is a registry (a dot, a port or ``localhost``), not a path component."""
    return "." in domain or ":" in domain or domain == "localhost"


def _registry_and_path(text: str, domain: str | None, path: str) -> tuple[str, str]:
    """The registry (``localhost`` when none) and the path, with a first part that names no registry
    ("user/image") moved back into the path."""
    if not domain:
        return "localhost", path
    if _names_a_registry(domain):
        return domain, path
    if not re.fullmatch(_COMPONENT, domain):
        raise InvalidReference(f"invalid image reference {text!r}: names are lower case")
    return "localhost", f"{domain}/{path}"


def is_image_id(text: str) -> bool:
    """The text can be an image id or a prefix of one, as a user types it (3 to 64 hex digits, ``sha256:``
    allowed), not a name."""
    return bool(_IMAGE_ID.match(text))


def validate(text: str) -> str:
    """``text`` (``normalize``d) if it is a valid reference or image id, else InvalidReference."""
    text = normalize(text)
    if is_image_id(text):
        return text
    parse(text)
    return text


def is_qualified(text: str) -> bool:
    """Whether ``text`` names its registry (``REGISTRY/NAME``), so podman resolves no short name."""
    text = normalize(text)
    first = text.split("/", 1)[0]
    return "/" in text and ("." in first or ":" in first or first == "localhost")


def candidate_names(text: str) -> list[str]:
    """Names under which a store may hold ``text`` (as podman-hpc resolves them)."""
    text = normalize(text)
    if ":" not in text.rsplit("/", 1)[-1] and "@" not in text:
        text = f"{text}:latest"
    names = [text]
    first = text.split("/", 1)[0]
    if not is_qualified(text):
        names += [f"localhost/{text}", f"docker.io/{text}"]
        if "/" not in text:
            names.append(f"docker.io/library/{text}")
    elif first == "docker.io" and text.count("/") == 1:
        names.append(f"docker.io/library/{text.split('/', 1)[1]}")
    return names
