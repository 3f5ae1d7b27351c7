"""Images as a user sees them: node-local and squashed (pulling them: ``engine.images.pull``)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field

from ..podman import Podman
from ..store.access import readable_stores
from ..store.squashed import SquashStore, StoredImage


@dataclass(frozen=True)
class ImageInfo:
    id: str
    names: list[str]
    size: int  # bytes: the squash file for a squashed-only image
    created: str  # ISO 8601
    local: bool  # in the node-local graph root
    squashed: bool  # in a squashed store
    store: str = ""  # the squashed store it runs from (the first that has it)
    additional: bool = False  # that store is an additional (project or site) store, not the user's own
    # names an image of higher precedence also has (node-local, then the personal
    # store, then the additional stores in order): `run NAME` gets that one
    shadowed: list[str] = field(default_factory=list)

    @property
    def short_id(self) -> str:
        """The image id's first 12 hex digits, as podman shows it."""
        return self.id[:12]

    @property
    def stores(self) -> str:
        """Where the image is, for a table: ``local``, ``squashed`` (``squashed in STORE`` for an additional
        store), or both joined by ``+``."""
        squashed = f"squashed in {self.store}" if self.additional else "squashed"
        return " + ".join(s for s, present in (("local", self.local), (squashed, self.squashed)) if present)

    def as_dict(self) -> dict:
        """The fields, with ``short_id`` and ``stores``, as the server and ``--json`` send them."""
        return {**asdict(self), "short_id": self.short_id, "stores": self.stores}


def find_squashed(config, ref: str) -> StoredImage | None:
    """``ref`` in the user's squashed store or one of the additional stores, in that precedence."""
    for directory in readable_stores(config):
        found = SquashStore(directory).find(ref)
        if found is not None:
            return found
    return None


def _created(value) -> str:
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="seconds")
    return str(value or "")


def list_images(podman: Podman) -> list[ImageInfo]:
    """Every image: local ones from podman, squashed ones from the stores' records.

    An image in several stores is listed once, from the first; names are
    resolved as podman resolves them, and a name an earlier image has is
    marked shadowed on the later one.
    """
    stores = readable_stores(podman.config)
    local = json.loads(podman("images", "--format", "json", squashed=False).stdout or "[]")
    squashed = _squashed_by_id(stores)
    personal = stores[0] if stores and stores[0] == podman.config.squash_dir else None
    infos = [_local_info(image, squashed, personal) for image in local]
    local_ids = {info.id for info in infos}
    infos += [
        _squashed_info(image, directory, personal)
        for image, directory in squashed.values()
        if image.id not in local_ids
    ]
    return sorted(_mark_shadowed(infos), key=lambda i: i.created, reverse=True)


def _squashed_by_id(stores: list[str]) -> dict[str, tuple[StoredImage, str]]:
    """Each squashed image with the store it is listed from: the first, in precedence, that has it."""
    squashed: dict[str, tuple[StoredImage, str]] = {}
    for directory in stores:
        for image in SquashStore(directory).images():
            squashed.setdefault(image.id, (image, directory))
    return squashed


def _local_info(image: dict, squashed: dict[str, tuple[StoredImage, str]], personal: str | None) -> ImageInfo:
    """A node-local image from ``podman images``, with the names and store of its squashed copy if any."""
    stored, directory = squashed.get(image["Id"], (None, ""))
    return ImageInfo(
        id=image["Id"],
        names=sorted(set(image.get("Names") or []) | set(stored.names if stored else ())),
        size=int(image.get("Size") or 0),
        created=_created(image.get("Created")),
        local=True,
        squashed=stored is not None,
        store=directory,
        additional=bool(directory) and directory != personal,
    )


def _squashed_info(image: StoredImage, directory: str, personal: str | None) -> ImageInfo:
    """A squashed image that is not node-local."""
    return ImageInfo(
        id=image.id,
        names=list(image.names),
        size=image.size,
        created=image.created,
        local=False,
        squashed=True,
        store=directory,
        additional=directory != personal,
    )


def _mark_shadowed(infos: list[ImageInfo]) -> list[ImageInfo]:
    """The images, one per id, each with the names an earlier one has (``shadowed``)."""
    found: dict[str, ImageInfo] = {}
    claimed: set[str] = set()
    for info in infos:
        shadowed = [name for name in info.names if name in claimed]
        claimed.update(info.names)
        found[info.id] = ImageInfo(**{**asdict(info), "shadowed": shadowed})
    return list(found.values())
