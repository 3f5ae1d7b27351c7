"""What a squashed store's records may say before the engine acts on them."""

import base64
import os

from jupyter_podman_hpc.engine.store.records import (
    SQUASH_DIGEST,
    image_ok,
    is_id,
    is_link,
    layer_of_link_target,
    layer_ok,
    set_squash_digest,
    split,
    squash_digest,
)

LAYER = "2108b300847846c93247b62e64e43dee44ad29772604f104a14cdcdd515c3b1c"


def test_ids_are_64_lowercase_hex_digits_and_nothing_that_walks_a_path():
    assert is_id(LAYER)
    for bad in (
        "../../..",
        "/home/victim",
        LAYER.upper(),
        LAYER[:63],
        LAYER + "0",
        f"../{LAYER[3:]}",
        f"{LAYER[:62]}/.",
        "",
        None,
        12,
    ):
        assert not is_id(bad), bad


def test_links_are_what_containers_storage_generates():
    # overlay's generateID(26): the first 26 characters of random bytes in standard base32
    generated = base64.b32encode(os.urandom(17)).decode()[:26]
    assert is_link(generated) and is_link("HH27KLVLMHONA4FWTLH3LL54FO")
    for bad in (
        "HH27KLVLMHONA4FWTLH3LL54F",
        "HH27KLVLMHONA4FWTLH3LL54F0",  # 0, 1, 8, 9 are not base32
        "hh27klvlmhona4fwtlh3ll54fo",
        "../../../../home/alice/.ss",
        "/HH27KLVLMHONA4FWTLH3LL54F",
    ):
        assert not is_link(bad), bad


def test_records_that_name_paths_are_split_off_untouched():
    good = {"id": "a" * 64, "layer": LAYER, "names": ["localhost/x:1"]}
    records = [
        good,
        {"id": "/home/victim"},
        {"id": "b" * 64, "layer": "../../.."},
        "text",
        {"id": "c" * 64, "names": "x"},
    ]
    assert split(records, image_ok) == ([good], records[1:])
    assert split([{"id": LAYER}, {"id": LAYER, "parent": "/etc"}, {"id": "../x"}], layer_ok) == (
        [{"id": LAYER}],
        [{"id": LAYER, "parent": "/etc"}, {"id": "../x"}],
    )
    assert split({"id": LAYER}, layer_ok) == ([], [{"id": LAYER}])


def test_the_squash_digest_lives_in_the_records_flags_beside_others():
    record = {"id": "a" * 64, "flags": {"someone-else": True}}
    assert squash_digest(record) == ""
    set_squash_digest(record, "d" * 64)
    assert record["flags"] == {"someone-else": True, SQUASH_DIGEST: "sha256:" + "d" * 64}
    assert squash_digest(record) == "d" * 64
    assert squash_digest({"flags": {SQUASH_DIGEST: "md5:abc"}}) == "" and squash_digest({"flags": "x"}) == ""


def test_a_short_link_must_point_at_its_layers_diff():
    assert layer_of_link_target(f"../{LAYER}/diff") == LAYER
    for bad in ("/home/victim", f"../{LAYER}/diff/..", f"../../{LAYER}/diff", "../x/diff", f"{LAYER}/diff"):
        assert layer_of_link_target(bad) == "", bad
