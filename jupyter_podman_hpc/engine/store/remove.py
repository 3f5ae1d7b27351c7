"""Removing an image from a squashed store (``podman-hpc rmsqi``): one of its names, or the image.

The reverse of a write (``store``): records first, files after. The image's
record goes (or only the name, while it has others), then the layer records
no other image of the store uses, all under the store's locks; then, no
longer reachable, their files. A layer's directory goes before its squash
file: an empty layer directory left by a kill would hide the same layer in
a later store from podman (upstream #172). In a sticky project store, an
image whose files another member owns is refused before any record changes
(``store.access.check_removable``).
"""

from __future__ import annotations

from .. import reference
from ..errors import EngineError, ImageNotFound
from .access import check_removable
from .graphroot import IMAGES
from .squashed import LAYERS, LINKS, OVERLAY, SquashStore, StoredImage, warn_once


def remove(store: SquashStore, ref: str) -> tuple[StoredImage, bool]:
    """Remove a name, or the whole image when it was the last name or ``ref`` is an id.

    Returns the image and whether its data was deleted. Layers still used
    by another squashed image are kept.
    """
    image = store.find(ref)
    if image is None:
        raise ImageNotFound(f"image {ref} is not in the squashed store {store.root}")
    by_id = reference.is_image_id(ref) and image.id.startswith(ref.removeprefix("sha256:"))
    with store.records() as (images, layers):
        record = next(r for r in images if r["id"] == image.id)
        if not by_id:
            matched = next(n for n in reference.candidate_names(ref) if n in (record.get("names") or []))
            record["names"] = [n for n in record["names"] if n != matched]
            if record["names"]:
                return image, False
        images.remove(record)
        used = _layers_in_use(images, layers)
        doomed = [(layer["id"], store.link_of(layer["id"])) for layer in layers if layer["id"] not in used]
        for layer_id, link in doomed:
            check_removable(
                store.tree,
                image.id,
                [(OVERLAY, layer_id)] + ([(LINKS, link), (LINKS, f"{link}.squash")] if link else []),
            )
        layers[:] = [layer for layer in layers if layer["id"] in used]
    _remove_files(store, image, doomed)
    return image, True


def _remove_files(store: SquashStore, image: StoredImage, doomed: list[tuple[str, str]]) -> None:
    """Records are gone: the files are unreachable now, delete them (a layer's directory before
    its squash file); what cannot be deleted is said once."""
    failed: list[str] = []
    tree = store.tree

    def attempt(action, parts, name):
        try:
            action(parts, name)
        except EngineError as err:
            failed.append(str(err))
        except OSError as err:
            failed.append(f"{tree.path(parts, name)}: {err.strerror}")

    attempt(tree.rmtree, IMAGES, image.id)
    for layer_id, link in doomed:
        if link:
            attempt(tree.unlink, LINKS, link)
        attempt(tree.rmtree, OVERLAY, layer_id)
        if link:
            attempt(tree.unlink, LINKS, f"{link}.squash")
        attempt(tree.unlink, LAYERS, f"{layer_id}.tar-split.gz")
    if failed:
        warn_once(
            f"remove:{image.id}", f"removed {image.short_id} from {store.root}; {len(failed)} file(s) stay: {failed[0]}"
        )


def _layers_in_use(images: list[dict], layers: list[dict]) -> set[str]:
    """The layers the images' top layers stand on, all the way down."""
    parents = {layer["id"]: layer.get("parent", "") for layer in layers}
    used: set[str] = set()
    for image in images:
        current = image.get("layer", "")
        while current and current not in used:
            used.add(current)
            current = parents.get(current, "")
    return used


__all__ = ["remove"]
