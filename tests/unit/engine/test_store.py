"""The squashed store's sharing and permission side, on plain directories (no podman)."""

import base64
import json
import os
import stat

import pytest

from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.errors import PermissionDenied
from jupyter_podman_hpc.engine.store import (SquashStore, make_store_dir, readable_stores, store_access,
                                             stored_command)


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
    assert mode(store.root) == 0o2770
    for path in store.root.rglob("*"):
        expected = 0o2770 if path.is_dir() else 0o660
        assert mode(path) == expected, path


def test_a_personal_store_keeps_the_umask(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    assert not mode(store.images_json) & 0o020 and not mode(store.root) & stat.S_ISGID


def test_missing_stores_are_left_out_and_the_order_is_personal_first(tmp_path):
    personal, extra = tmp_path / "mine", tmp_path / "extra"
    personal.mkdir()
    extra.mkdir()
    config = load_config({"SQUASH_DIR": str(personal),
                          "PODMANHPC_ADDITIONAL_STORES": f"{extra},{tmp_path}/none,{personal}"})
    assert readable_stores(config) == [str(personal), str(extra)]
    assert store_access(f"{tmp_path}/none") == "missing"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_a_store_with_a_private_image_directory_is_refused_with_the_fix(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    private = store.root / "overlay-images" / ("b" * 64)
    private.mkdir(mode=0o700)
    private.chmod(0o000)
    try:
        with pytest.raises(PermissionDenied) as refused:
            readable_stores(load_config({"SQUASH_DIR": str(store.root)}))
        message = str(refused.value)
        assert message.startswith(f"cannot read the image store {store.root}: {private} is ")
        assert f"chmod -R g+rX {store.root}" in message and "\n" not in message
    finally:
        private.chmod(0o700)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes everything")
def test_writes_into_a_store_we_may_not_write_are_refused_in_one_line(tmp_path):
    store = SquashStore(tmp_path / "store")
    store.init()
    store.root.chmod(0o555)
    try:
        with pytest.raises(PermissionDenied) as refused:
            SquashStore(store.root).init()
        assert str(refused.value).startswith(f"cannot write to the image store {store.root}: {store.root} is ")
        assert store_access(str(store.root)) == "read-only"
    finally:
        store.root.chmod(0o755)


def storage_with(root, image_id, names, config):
    """A storage's image records as containers/storage writes them (the config is big data)."""
    images = root / "overlay-images"
    (images / image_id).mkdir(parents=True)
    (images / "images.json").write_text(json.dumps([{"id": image_id, "names": names}]))
    key = base64.b64encode(f"sha256:{image_id}".encode()).decode()
    if config is not None:
        (images / image_id / f"={key}").write_text(json.dumps({"config": config}))
    return str(root)


def test_the_image_command_comes_from_the_first_storage_naming_the_image(tmp_path):
    name = "registry.example:5000/team/app:1"
    local = storage_with(tmp_path / "local", "a" * 64, [name], {"Entrypoint": ["python3"], "Cmd": None})
    squashed = storage_with(tmp_path / "squash", "b" * 64, [name, "localhost/x:1"], {"Cmd": ["sh"]})
    assert stored_command([local, squashed], name) == (["python3"], None)
    assert stored_command([str(tmp_path / "missing"), squashed], name) == (None, ["sh"])
    assert stored_command([local, squashed], "localhost/x") is None  # :latest is not x:1
    assert stored_command([local, squashed], "localhost/x:1") == (None, ["sh"])


def test_podman_answers_for_short_names_ids_and_records_without_a_config(tmp_path):
    squashed = storage_with(tmp_path / "squash", "c" * 64, ["localhost/x:1"], None)
    assert stored_command([squashed], "x:1") is None  # short-name resolution is podman's
    assert stored_command([squashed], "c" * 12) is None
    assert stored_command([squashed], "localhost/x:1") is None  # the config is not there
    assert stored_command([squashed], "localhost/other:1") is None
