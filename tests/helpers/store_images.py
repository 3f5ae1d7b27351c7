"""Images squashed into a store as migrate leaves them (engine/store/squashed.py,
engine/store/remove.py)."""

import json
import os

LINK = "HH27KLVLMHONA4FWTLH3LL54FO"


def squashed_image(store, image_id, layer, link, names):
    """An image as migrate leaves it in the store: big data, layer skeleton, link, squash file, records."""
    (store.root / "overlay-images" / image_id).mkdir()
    (store.root / "overlay-images" / image_id / "manifest").write_text("{}")
    (store.root / "overlay" / layer / "diff").mkdir(parents=True)
    (store.root / "overlay" / layer / "link").write_text(link)
    (store.links / link).symlink_to(f"../{layer}/diff")
    (store.links / f"{link}.squash").write_bytes(b"hsqs" + os.urandom(1000))
    for path, record in (
        (store.images_json, {"id": image_id, "layer": layer, "names": names}),
        (store.layers_json, {"id": layer}),
    ):
        path.write_text(json.dumps([*json.loads(path.read_text()), record]))
