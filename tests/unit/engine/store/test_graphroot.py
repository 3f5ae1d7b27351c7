"""GraphRoot.find: the one match of a reference or an id against a storage's image records;
stored_command: an image's ENTRYPOINT and CMD read from the storages' records."""

import base64
import hashlib
import json

from jupyter_podman_hpc.engine.store.graphroot import GraphRoot, stored_command

FIRST, SECOND = "a" * 64, "ab" + "c" * 62


def graph_root(tmp_path, records):
    (tmp_path / "overlay-images").mkdir()
    (tmp_path / "overlay-images" / "images.json").write_text(json.dumps(records))
    return GraphRoot(tmp_path)


def test_find_matches_names_in_any_of_podmans_spellings_and_ids_by_prefix(tmp_path):
    root = graph_root(
        tmp_path,
        [{"id": FIRST, "names": ["docker.io/library/busybox:latest"]}, {"id": SECOND, "names": ["localhost/x:1"]}],
    )
    assert root.find("busybox")["id"] == FIRST
    assert root.find("docker.io/library/busybox")["id"] == FIRST
    assert root.find("localhost/x:1")["id"] == SECOND
    assert root.find("localhost/x:2") is None
    assert root.find(SECOND[:12])["id"] == SECOND
    assert root.find(f"sha256:{FIRST}")["id"] == FIRST


def test_a_hex_looking_short_name_is_tried_as_a_name_after_the_ids(tmp_path):
    root = graph_root(tmp_path, [{"id": FIRST, "names": ["docker.io/library/deadbeef:latest"]}])
    assert root.find("deadbeef")["id"] == FIRST


def test_records_that_are_not_safe_and_missing_files_find_nothing(tmp_path):
    root = graph_root(tmp_path, [{"id": "../../etc", "names": ["localhost/x:1"]}, "not a record"])
    assert root.find("localhost/x:1") is None and root.images() == []
    assert GraphRoot(tmp_path / "missing").find("localhost/x:1") is None


def storage_with(root, names, config, image_id=None):
    """A storage's image records as containers/storage writes them (the config is big data,
    the image id its digest)."""
    data = json.dumps({"config": config}).encode()
    image_id = image_id or hashlib.sha256(data).hexdigest()
    images = root / "overlay-images"
    (images / image_id).mkdir(parents=True)
    (images / "images.json").write_text(json.dumps([{"id": image_id, "names": names}]))
    key = base64.b64encode(f"sha256:{image_id}".encode()).decode()
    if config is not None:
        (images / image_id / f"={key}").write_bytes(data)
    return str(root)


def test_the_image_command_comes_from_the_first_storage_naming_the_image(tmp_path):
    name = "registry.example:5000/team/app:1"
    local = storage_with(tmp_path / "local", [name], {"Entrypoint": ["python3"], "Cmd": None})
    squashed = storage_with(tmp_path / "squash", [name, "localhost/x:1"], {"Cmd": ["sh"]})
    assert stored_command([local, squashed], name) == (["python3"], None)
    assert stored_command([str(tmp_path / "missing"), squashed], name) == (None, ["sh"])
    assert stored_command([local, squashed], "localhost/x") is None  # :latest is not x:1
    assert stored_command([local, squashed], "localhost/x:1") == (None, ["sh"])


def test_podman_answers_for_short_names_ids_and_records_without_a_config(tmp_path):
    squashed = storage_with(tmp_path / "squash", ["localhost/x:1"], None, image_id="c" * 64)
    assert stored_command([squashed], "x:1") is None  # short-name resolution is podman's
    assert stored_command([squashed], "c" * 12) is None
    assert stored_command([squashed], "localhost/x:1") is None  # the config is not there
    assert stored_command([squashed], "localhost/other:1") is None


def test_a_config_changed_in_a_shared_store_is_left_to_podman(tmp_path):
    """The image id is the config's digest: a member who rewrites another's config (to change
    its ENTRYPOINT) gets nothing from shared-run's shortcut, and podman refuses the image."""
    squashed = storage_with(tmp_path / "squash", ["localhost/x:1"], {"Cmd": ["sh"]})
    config = next((tmp_path / "squash" / "overlay-images").glob("*/=*"))
    config.write_text(json.dumps({"config": {"Entrypoint": ["/tmp/evil"]}}))
    assert stored_command([squashed], "localhost/x:1") is None


def test_records_with_ids_that_are_not_ids_are_never_used_as_paths(tmp_path):
    squashed = storage_with(tmp_path / "squash", ["localhost/x:1"], {"Cmd": ["sh"]})
    images = tmp_path / "squash" / "overlay-images" / "images.json"
    images.write_text(json.dumps([{"id": "../../etc", "names": ["localhost/x:1"]}]))
    assert stored_command([squashed], "localhost/x:1") is None
