"""GraphRoot.find: the one match of a reference or an id against a storage's image records."""

import json

from jupyter_podman_hpc.engine.graphroot import GraphRoot

FIRST, SECOND = "a" * 64, "ab" + "c" * 62


def graph_root(tmp_path, records):
    (tmp_path / "overlay-images").mkdir()
    (tmp_path / "overlay-images" / "images.json").write_text(json.dumps(records))
    return GraphRoot(tmp_path)


def test_find_matches_names_in_any_of_podmans_spellings_and_ids_by_prefix(tmp_path):
    root = graph_root(tmp_path, [{"id": FIRST, "names": ["docker.io/library/busybox:latest"]},
                                 {"id": SECOND, "names": ["localhost/x:1"]}])
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
