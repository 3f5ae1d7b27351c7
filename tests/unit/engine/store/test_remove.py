"""Removing an image from a squashed store: only what no other image uses, and never what a
record names outside the store."""

import json

from jupyter_podman_hpc.engine.store.remove import remove
from jupyter_podman_hpc.engine.store.squashed import SquashStore
from tests.helpers.store_images import LINK, squashed_image


def test_rmsqi_never_acts_on_records_whose_ids_are_paths(tmp_path, caplog):
    """A member appends layer records whose ids lead out of the store (to the victim's home);
    the victim's next removal of an unrelated image removes that image only."""
    home = tmp_path / "home" / "victim"
    (home / "keep").mkdir(parents=True)
    (home / "keep" / "thesis.tex").write_text("years of work")
    store = SquashStore(tmp_path / "store")
    store.init()
    squashed_image(store, "a" * 64, "1" * 64, LINK, ["localhost/unrelated:1"])
    squashed_image(store, "b" * 64, "2" * 64, "Q" * 26, ["localhost/other:1"])
    depth = len(store.root.joinpath("overlay").parts) - 1
    planted = [
        {"id": str(home / "keep")},
        {"id": "../" * depth + str(home / "keep")[1:]},
        {"id": "3" * 64, "parent": "../../home"},
    ]
    store.layers_json.write_text(json.dumps(json.loads(store.layers_json.read_text()) + planted))
    (store.root / "overlay" / ("4" * 64)).symlink_to(home / "keep")  # a valid id, its directory a link
    store.layers_json.write_text(json.dumps([*json.loads(store.layers_json.read_text()), {"id": "4" * 64}]))

    image, deleted = remove(store, "localhost/unrelated:1")
    assert deleted and image.id == "a" * 64
    assert (home / "keep" / "thesis.tex").read_text() == "years of work"
    assert not (store.links / f"{LINK}.squash").exists() and not (store.root / "overlay" / ("1" * 64)).exists()
    assert (store.links / f"{'Q' * 26}.squash").exists()  # the other image is whole
    assert [i.names for i in store.images()] == [("localhost/other:1",)]
    assert "ignoring 3 record(s)" in caplog.text and "never acted on" in caplog.text
    # the records it skipped stay as they were (nothing acts on them); the valid unused one went
    left = json.loads(store.layers_json.read_text())
    assert [r["id"] for r in left] == ["2" * 64] + [r["id"] for r in planted]
