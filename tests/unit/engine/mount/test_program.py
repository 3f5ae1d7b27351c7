"""The mount program's choice of squash file, and its refusal of one that is not its record's
(before any mount or unpack)."""

import hashlib
import json
import os
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.mount import program as mount
from jupyter_podman_hpc.engine.store.records import SQUASH_DIGEST

LAYER = "2108b300847846c93247b62e64e43dee44ad29772604f104a14cdcdd515c3b1c"
LINK = "HH27KLVLMHONA4FWTLH3LL54FO"


def squash_bytes(body: bytes) -> bytes:
    """A file that starts as a whole squashfs image does (magic, its length at bytes_used),
    then ``body``; the mount program refuses a truncated one before anything else."""
    data = bytearray(b"hsqs" + body.ljust(44, b"\0"))
    data[40:48] = len(data).to_bytes(8, "little")
    return bytes(data)


def store_with(root, digest="", record=True):
    """A store holding one squashed image (its squash file arbitrary bytes) of LAYER."""
    (root / "overlay" / LAYER / "diff").mkdir(parents=True)
    (root / "overlay" / "l").mkdir()
    (root / "overlay" / "l" / LINK).symlink_to(f"../{LAYER}/diff")
    squash = root / "overlay" / "l" / f"{LINK}.squash"
    squash.write_bytes(squash_bytes(os.urandom(4096)))
    (root / "overlay-images").mkdir()
    image = {"id": "a" * 64, "layer": LAYER, "names": ["localhost/x:1"]}
    if digest:
        image["flags"] = {SQUASH_DIGEST: f"sha256:{digest}"}
    (root / "overlay-images" / "images.json").write_text(json.dumps([image] if record else []))
    return root / "overlay" / "l" / LINK, squash


def test_a_squash_file_its_store_records_is_used_with_its_digests(tmp_path):
    lower, squash = store_with(tmp_path / "store", "d" * 64)
    assert mount.squash_of(lower) == (squash, lower, {"d" * 64})


def test_a_squash_file_no_record_vouches_for_is_not_used(tmp_path):
    lower, _ = store_with(tmp_path / "store", record=False)
    assert mount.squash_of(lower) is None


def test_a_short_link_pointing_out_of_its_store_is_not_followed(tmp_path):
    lower, _ = store_with(tmp_path / "store", "d" * 64)
    lower.unlink()
    lower.symlink_to(tmp_path)  # planted: a directory of the user's
    assert mount.squash_of(lower) is None


def test_a_changed_squash_file_is_refused_in_one_line_before_anything_is_mounted(tmp_path, monkeypatch, capsys):
    lower, squash = store_with(tmp_path / "store")
    digest = hashlib.sha256(squash.read_bytes()).hexdigest()
    images = tmp_path / "store" / "overlay-images" / "images.json"
    records = json.loads(images.read_text())
    records[0]["flags"] = {SQUASH_DIGEST: f"sha256:{digest}"}
    images.write_text(json.dumps(records))
    with open(squash, "r+b") as out:  # rewritten after it was squashed
        out.seek(100)
        out.write(b"evil")
    layer = tmp_path / "graph" / "overlay" / ("c" * 64)
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    (tmp_path / "shm" / "unpacked").mkdir(parents=True, mode=0o700)  # podman-hpc made it (prepare_state)
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_DIR", str(tmp_path / "shm" / "unpacked"))
    ran = []
    monkeypatch.setattr(mount.commands, "run", lambda argv, **kw: ran.append(argv))
    code = mount.main(["-o", f"lowerdir={lower},upperdir={layer}/diff,workdir={layer}/work", str(layer / "merged")])
    err = capsys.readouterr().err
    assert code == 1 and ran == []  # no unsquashfs, no squashfuse, no fuse-overlayfs
    assert err == (
        f"podman-hpc-mount: squash file {squash} does not match its record: it was changed after "
        "it was squashed; squash the image again"
    )  # no newline: podman puts it in one line
    assert os.listdir(tmp_path / "shm" / "unpacked") == []


# --- a local image read from its squashed copy ----------------------------------------

TOP = "86242563a452aa4151b152b99c09761d8c97f2ca120e5788d6693b93d8601b28"
TOP_LINK = "4CLOISB6ZDNDIHCCBRPWNQSFVG"
BUILT = "f" * 64
BUILT_LINK = "ZZ27KLVLMHONA4FWTLH3LL54FO"


def local_layer(graph, layer, link, parents=()):
    """A layer of a node-local graph root (with a file), its short link and ``lower`` file."""
    overlay = graph / "overlay"
    (overlay / layer / "diff").mkdir(parents=True)
    (overlay / layer / "diff" / "file").write_text(layer)
    (overlay / layer / "link").write_text(link)
    if parents:
        (overlay / layer / "lower").write_text(":".join(f"l/{p}" for p in parents))
    (overlay / "l").mkdir(exist_ok=True)
    (overlay / "l" / link).symlink_to(f"../{layer}/diff")
    return overlay / "l" / link


def squashed_store(root, layer=TOP, link=TOP_LINK):
    """The user's own store with the image of ``layer`` squashed (as ``podman-hpc pull`` leaves it)."""
    (root / "overlay" / layer / "diff").mkdir(parents=True)
    (root / "overlay" / layer / "link").write_text(link)
    (root / "overlay" / "l").mkdir()
    (root / "overlay" / "l" / link).symlink_to(f"../{layer}/diff")
    squash = root / "overlay" / "l" / f"{link}.squash"
    squash.write_bytes(squash_bytes(b""))
    (root / "overlay-images").mkdir()
    image = {"id": "a" * 64, "layer": layer, "names": ["localhost/x:1"], "flags": {SQUASH_DIGEST: "sha256:" + "d" * 64}}
    (root / "overlay-images" / "images.json").write_text(json.dumps([image]))
    return squash


@pytest.fixture
def pulled(tmp_path):
    """(graph root, lower of the pulled image, store): the image local and squashed."""
    graph = tmp_path / "graph"
    lower = local_layer(graph, TOP, TOP_LINK)
    store = tmp_path / "store"
    squashed_store(store)
    return graph, lower, store


def test_a_pulled_image_is_read_from_its_squash_file(pulled):
    graph, lower, store = pulled
    squash = store / "overlay" / "l" / f"{TOP_LINK}.squash"
    assert mount.squash_of_local_image([lower], graph, [str(store)]) == (
        squash,
        store / "overlay" / "l" / TOP_LINK,
        {"d" * 64},
    )


def test_relative_lowers_as_podman_gives_them_when_long_are_the_same_chain(pulled, monkeypatch):
    graph, _, store = pulled
    monkeypatch.chdir(graph / "overlay")
    assert mount.squash_of_local_image([Path.cwd() / "l" / TOP_LINK], graph, [str(store)]) is not None


def test_an_image_built_on_the_squashed_one_keeps_its_own_layers(pulled):
    graph, base, store = pulled
    built = local_layer(graph, BUILT, BUILT_LINK, parents=[TOP_LINK])
    assert mount.squash_of_local_image([built, base], graph, [str(store)]) is None
    # ... until it is squashed itself: then its whole chain is its squash file
    other = squashed_store(store.parent / "store2", BUILT, BUILT_LINK)
    found = mount.squash_of_local_image([built, base], graph, [str(store), str(store.parent / "store2")])
    assert found is not None and found[0] == other


@pytest.mark.parametrize(
    "lowers",
    [
        lambda graph, top, extra: [top, extra],  # more than the image's chain
        lambda graph, top, extra: [extra, top],  # the squashed layer below another
        lambda graph, top, extra: [],  # nothing
    ],
)
def test_lowers_that_are_not_exactly_the_squashed_image_chain_keep_their_layers(pulled, lowers):
    graph, top, store = pulled
    extra = local_layer(graph, "e" * 64, "EE27KLVLMHONA4FWTLH3LL54FO")
    assert mount.squash_of_local_image(lowers(graph, top, extra), graph, [str(store)]) is None


def test_a_chain_missing_a_parent_its_lower_file_lists_is_not_replaced(pulled):
    graph, _base, store = pulled
    squashed_store(store.parent / "store2", BUILT, BUILT_LINK)
    built = local_layer(graph, BUILT, BUILT_LINK, parents=[TOP_LINK])
    assert mount.squash_of_local_image([built], graph, [str(store.parent / "store2")]) is None


def test_lowers_in_a_store_are_not_a_local_image(pulled):
    graph, _, store = pulled
    assert mount.squash_of_local_image([store / "overlay" / "l" / TOP_LINK], graph, [str(store)]) is None


def test_a_store_others_may_write_is_not_used_for_a_local_image(pulled):
    """A project store's members could record any squash file under a public image's layer id."""
    graph, lower, store = pulled
    for directory in (store / "overlay-images", store / "overlay" / TOP):
        directory.chmod(0o2770)
        assert mount.squash_of_local_image([lower], graph, [str(store)]) is None
        directory.chmod(0o755)
    assert mount.squash_of_local_image([lower], graph, [str(store)]) is not None


def test_a_squash_file_without_a_record_does_not_replace_a_local_image(pulled):
    graph, lower, store = pulled
    (store / "overlay-images" / "images.json").write_text("[]")
    assert mount.squash_of_local_image([lower], graph, [str(store)]) is None


def test_a_changed_squash_file_of_a_pulled_image_is_refused(pulled, tmp_path, monkeypatch, capsys):
    graph, lower, store = pulled
    squash = store / "overlay" / "l" / f"{TOP_LINK}.squash"
    layer = graph / "overlay" / ("c" * 64)
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    (tmp_path / "shm" / "unpacked").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_DIR", str(tmp_path / "shm" / "unpacked"))
    monkeypatch.setattr(mount, "_podman_stores", lambda: [str(store)])
    ran = []
    monkeypatch.setattr(mount.commands, "run", lambda argv, **kw: ran.append(argv))
    code = mount.main(["-o", f"lowerdir={lower},upperdir={layer}/diff,workdir={layer}/work", str(layer / "merged")])
    assert code == 1 and ran == []  # the digest recorded is not the file's: nothing mounted, not even fuse-overlayfs
    assert capsys.readouterr().err.startswith(f"podman-hpc-mount: squash file {squash} does not match its record")


def test_with_id_mappings_a_pulled_image_keeps_its_local_layers(pulled, tmp_path, monkeypatch):
    """--userns keep-id: podman asks for uidmapping=, which only fuse-overlayfs does; squashfuse below
    fuse-overlayfs fails there, the local layers work."""
    graph, lower, store = pulled
    layer = graph / "overlay" / ("c" * 64)
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    monkeypatch.setattr(mount, "_podman_stores", lambda: [str(store)])
    ran = []
    monkeypatch.setattr(mount, "_fuse_overlay", lambda argv: ran.append(argv) or 0)
    options = f"lowerdir={lower},upperdir={layer}/diff,workdir={layer}/work,uidmapping=0:1:1"
    assert mount.main(["-o", options, str(layer / "merged")]) == 0
    assert ran == [["-o", options, str(layer / "merged")]]  # as podman gave it: the local layers


@pytest.mark.parametrize(
    "variables",
    [
        {"PODMANHPC_SQUASH_JOB": ""},  # a login node: auto does not unpack
        {"PODMANHPC_SQUASH_READ_PATH": "kernel"},  # squashfuse: no faster than the local layers
        {"PODMANHPC_SQUASH_UNPACK_MAX_MB": "0.000001"},  # no room for a copy
        {
            "PODMANHPC_SQUASH_JOB": "7",
            "PODMANHPC_SQUASH_JOB_NODES": "900",  # the job's nodes would read too much
            "PODMANHPC_SQUASH_UNPACK_AUTO_JOB_MAX_MB": "0.0001",
        },
    ],
)
def test_without_an_unpacked_copy_a_pulled_image_keeps_its_local_layers(pulled, tmp_path, monkeypatch, variables):
    graph, lower, store = pulled
    squash = store / "overlay" / "l" / f"{TOP_LINK}.squash"
    digest = hashlib.sha256(squash.read_bytes()).hexdigest()
    images = store / "overlay-images" / "images.json"
    records = json.loads(images.read_text())
    records[0]["flags"] = {SQUASH_DIGEST: f"sha256:{digest}"}
    images.write_text(json.dumps(records))
    layer = graph / "overlay" / ("c" * 64)
    for name in ("diff", "work", "merged"):
        (layer / name).mkdir(parents=True)
    (tmp_path / "shm" / "unpacked").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_DIR", str(tmp_path / "shm" / "unpacked"))
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(mount, "_podman_stores", lambda: [str(store)])
    ran = []
    monkeypatch.setattr(mount, "_fuse_overlay", lambda argv: ran.append(argv) or 0)
    monkeypatch.setattr(mount.commands, "run", lambda argv, **kw: pytest.fail(f"ran {argv}"))  # no squashfuse
    options = f"lowerdir={lower},upperdir={layer}/diff,workdir={layer}/work"
    assert mount.main(["-o", options, str(layer / "merged")]) == 0
    assert ran == [["-o", options, str(layer / "merged")]]
