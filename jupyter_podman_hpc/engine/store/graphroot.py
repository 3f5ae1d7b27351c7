"""A podman overlay graph root read as podman reads it: image records, layer chains, links.

Every image store podman uses has this layout (``overlay-images/images.json``,
``overlay-layers/layers.json``, ``overlay/<layer>/link``): the node-local
storage, and each squashed store (``engine.store.squashed`` writes those). Records are
checked as they are read (``records``); ``find`` is the one place a reference
or an id is matched against them, and ``stored_command`` reads an image's
ENTRYPOINT and CMD without podman.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

from .. import reference
from ..errors import EngineError, ImageNotFound
from .fs import Tree
from .records import image_ok, is_id, is_link, layer_ok

IMAGES = ("overlay-images",)


class GraphRoot:
    """Read access to a podman overlay graph root (the node-local storage)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _json(self, name: str) -> list[dict]:
        try:
            return json.loads((self.root / name).read_text() or "[]")
        except FileNotFoundError:
            return []

    def images(self) -> list[dict]:
        """The image records of ``overlay-images/images.json`` that are safe to act on; [] when it is
        missing or unreadable. Read without following links (``store.fs``), so a shared store's
        records can be read this way too."""
        try:
            records = json.loads(Tree(self.root).read(IMAGES, "images.json") or b"[]")
        except (OSError, ValueError, EngineError):
            return []
        return [record for record in records if image_ok(record)] if isinstance(records, list) else []

    def find(self, ref_or_id: str) -> dict | None:
        """The image record an id (or id prefix) or a name (any of podman's spellings) names, else None.

        An id-looking reference is matched as an id prefix first, then as a name (a hex-looking
        short name)."""
        records = self.images()
        if reference.is_image_id(ref_or_id):
            ref_or_id = ref_or_id.removeprefix("sha256:")
            found = next((record for record in records if record["id"].startswith(ref_or_id)), None)
            if found is not None:
                return found
        names = set(reference.candidate_names(ref_or_id))
        return next((record for record in records if names & set(record.get("names") or ())), None)

    def image_record(self, image_id: str) -> dict:
        """The images.json record of ``image_id`` when it is complete; ImageNotFound otherwise."""
        for record in self._json("overlay-images/images.json"):
            if record.get("id") == image_id and image_ok(record):
                return record
        raise ImageNotFound(f"image {image_id[:12]} is not in the local storage {self.root}")

    def layer_chain(self, top: str) -> list[dict]:
        """The layer records from ``top`` down to the base layer."""
        layers = {record["id"]: record for record in self._json("overlay-layers/layers.json") if layer_ok(record)}
        chain, current = [], top
        while current:
            if current not in layers:
                raise EngineError(f"layer {current[:12]} of the image is missing from {self.root}")
            chain.append(layers[current])
            current = layers[current].get("parent", "")
        return chain

    def link(self, layer: str) -> str:
        """The short link name of ``layer`` (its ``overlay/<id>/link`` file); EngineError when the id or
        link is not one containers/storage would write."""
        link = (self.root / "overlay" / layer / "link").read_text().strip() if is_id(layer) else ""
        if not is_link(link):
            raise EngineError(f"layer {layer[:12]} of {self.root} has no valid link: the local storage is damaged")
        return link

    def diff(self, layer: str) -> Path:
        """The directory that holds ``layer``'s files (``overlay/<id>/diff``); not checked."""
        return self.root / "overlay" / layer / "diff"

    def big_data(self, image_id: str) -> Path:
        """The directory of ``image_id``'s manifest and config (``overlay-images/<id>``); not checked."""
        return self.root / "overlay-images" / image_id

    def tar_split(self, layer: str) -> Path:
        """The tar-split file of ``layer`` (``overlay-layers/<id>.tar-split.gz``: what rebuilds its tar
        stream), which a squashed store gets a copy of; not checked."""
        return self.root / "overlay-layers" / f"{layer}.tar-split.gz"


__all__ = ["GraphRoot"]


def stored_command(storages: list[str], ref: str) -> tuple[list[str] | None, list[str] | None] | None:
    """The ENTRYPOINT and CMD of the image podman runs for ``ref``, from the storages' own
    records, searched in podman's order (the node-local graph root, then the squashed
    stores); None when that takes podman (a short name, an id, no readable record).

    A shared-run step reads them here instead of running ``podman image inspect``
    beside the node container's start: on a node of few cores that is a second
    podman process competing with the first.
    """
    if reference.is_image_id(ref) or not reference.is_qualified(ref):
        return None  # podman's short-name resolution and id prefixes stay podman's
    for storage in storages:
        record = GraphRoot(storage).find(ref)
        if record is None:
            continue
        tree = Tree(storage)
        key = base64.b64encode(f"sha256:{record['id']}".encode()).decode()
        try:
            data = tree.read((*IMAGES, record["id"]), f"={key}")
            # the image id is the config's digest: a config changed in a shared store is podman's to refuse
            if data is None or hashlib.sha256(data).hexdigest() != record["id"]:
                return None
            config = json.loads(data).get("config") or {}
        except (OSError, ValueError, AttributeError, EngineError):
            return None
        return config.get("Entrypoint"), config.get("Cmd")
    return None
