"""The squashed store on plain directories (no podman): the modes a project store's files get,
records used as paths, lock files, squash digests."""

import json
import stat

import pytest

from jupyter_podman_hpc.engine.errors import PermissionDenied
from jupyter_podman_hpc.engine.store.access import make_store_dir
from jupyter_podman_hpc.engine.store.records import SQUASH_DIGEST
from jupyter_podman_hpc.engine.store.squashed import SquashStore
from tests.helpers.store_images import LINK, squashed_image


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_a_setgid_store_is_shared_with_its_group_and_closed_to_others(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2770)
    make_store_dir(str(project / "store"))  # created inside the project directory: shared like it
    store = SquashStore(project / "store")
    store.init()
    with store.image_lock("a" * 64):
        pass
    # sticky, so members cannot rename or remove each other's files; the record directories
    # not, since every member replaces images.json and layers.json
    assert mode(store.root) == 0o3770
    for path in store.root.rglob("*"):
        records = path.relative_to(store.root).parts[0] in ("overlay-images", "overlay-layers")
        expected = (0o2770 if records else 0o3770) if path.is_dir() else 0o660
        assert mode(path) == expected, path


def test_a_read_only_project_store_is_2750_without_sticky_bits(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2750)
    store = SquashStore(project / "store")
    store.init()
    assert {mode(p) for p in [store.root, *store.root.rglob("*")] if p.is_dir()} == {0o2750}


def test_a_personal_store_keeps_the_umask(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    assert not mode(store.images_json) & 0o020 and not mode(store.root) & stat.S_ISGID


# --- records used as paths --------------------------------------------------------------


def test_a_link_that_is_no_link_name_is_not_used_as_a_file_name(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    squashed_image(store, "a" * 64, "1" * 64, LINK, ["localhost/x:1"])
    (store.root / "overlay" / ("1" * 64) / "link").write_text("../../../../etc/passwd")
    assert store.link_of("1" * 64) == "" and store.images()[0].squash_file == ""
    assert not store.has_complete("a" * 64)


def test_a_symlinked_lock_file_refuses_the_write_in_one_line(tmp_path):
    target = tmp_path / "id_ed25519"
    target.write_text("key")
    target.chmod(0o600)
    store = SquashStore(tmp_path / "store")
    store.init()
    (store.root / "overlay-images" / "images.lock").unlink(missing_ok=True)
    (store.root / "overlay-images" / "images.lock").symlink_to(target)
    with pytest.raises(PermissionDenied, match=r"images\.lock: it is a symbolic link"):
        store.add_names("a" * 64, ["localhost/x:1"])
    assert target.read_text() == "key" and mode(target) == 0o600


def test_publish_records_the_squash_digest_for_every_image_of_the_layer(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    squashed_image(store, "a" * 64, "1" * 64, LINK, ["localhost/x:1"])  # same top layer, squashed before
    record = {"id": "b" * 64, "layer": "1" * 64, "names": ["localhost/x:2"]}
    store.publish(record, [{"id": "1" * 64}], "d" * 64)
    assert store.squash_digests("1" * 64) == {"d" * 64}
    assert all(r["flags"] == {SQUASH_DIGEST: "sha256:" + "d" * 64} for r in json.loads(store.images_json.read_text()))
