"""Images as a user sees them: node-local and squashed, and pulling them."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass

from .migrate import MigrateResult, migrate
from .podman import Podman
from .progress import ProgressCallback, ignore
from .store import SquashStore


@dataclass(frozen=True)
class ImageInfo:
    id: str
    names: list[str]
    size: int            # bytes: the squash file for a squashed-only image
    created: str         # ISO 8601
    local: bool          # in the node-local graph root
    squashed: bool       # in the squashed store

    @property
    def short_id(self) -> str:
        return self.id[:12]

    @property
    def stores(self) -> str:
        return " + ".join(s for s, present in (("local", self.local), ("squashed", self.squashed)) if present)

    def as_dict(self) -> dict:
        return {**asdict(self), "short_id": self.short_id, "stores": self.stores}


def _created(value) -> str:
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc).isoformat(timespec="seconds")
    return str(value or "")


def list_images(podman: Podman) -> list[ImageInfo]:
    """Every image: local ones from podman, squashed ones from the store's records."""
    local = json.loads(podman("images", "--format", "json", squashed=False).stdout or "[]")
    store = SquashStore(podman.config.squash_dir)
    squashed = {image.id: image for image in store.images()}
    found: dict[str, ImageInfo] = {}
    for image in local:
        names = image.get("Names") or []
        stored = squashed.get(image["Id"])
        found[image["Id"]] = ImageInfo(
            id=image["Id"], names=sorted(set(names) | set(stored.names if stored else ())),
            size=int(image.get("Size") or 0), created=_created(image.get("Created")),
            local=True, squashed=stored is not None)
    for image in squashed.values():
        if image.id not in found:
            found[image.id] = ImageInfo(id=image.id, names=list(image.names), size=image.size,
                                        created=image.created, local=False, squashed=True)
    return sorted(found.values(), key=lambda i: i.created, reverse=True)


def pull(podman: Podman, ref: str, *, squash: bool = True, pull_args: list[str] | None = None,
         progress: ProgressCallback = ignore, quiet: bool = True) -> MigrateResult | None:
    """``podman pull`` into the node-local storage, then squash it (unless told not to)."""
    podman.run(podman.command("pull", *(pull_args or []), *(["--quiet"] if quiet else []), ref),
               capture=quiet)
    return migrate(podman, ref, progress) if squash else None
