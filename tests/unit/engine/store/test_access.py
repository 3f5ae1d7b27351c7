"""Which stores apply (missing ones left out, the user's own first), stores closed to the user,
and writes refused before anything is written."""

import os

import pytest

from jupyter_podman_hpc.engine.errors import ConfigError, PermissionDenied
from jupyter_podman_hpc.engine.site.config import load_config
from jupyter_podman_hpc.engine.store.access import check_writable, readable_stores, store_access
from jupyter_podman_hpc.engine.store.squashed import SquashStore


def test_missing_stores_are_left_out_and_the_order_is_personal_first(tmp_path):
    personal, extra = tmp_path / "mine", tmp_path / "extra"
    personal.mkdir()
    extra.mkdir()
    config = load_config(
        {"SQUASH_DIR": str(personal), "PODMANHPC_ADDITIONAL_STORES": f"{extra},{tmp_path}/none,{personal}"}
    )
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


def test_no_squash_dir_is_a_configuration_error_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="no squashed image store"):
        check_writable("")
    with pytest.raises(ConfigError, match="no squashed image store"):
        SquashStore("")
