"""The OCI hook's copies stay inside the container's root; the image's ldconfig never runs."""

import os
import shutil
import subprocess
import sys

import pytest

from jupyter_podman_hpc.engine.site import hook


@pytest.fixture
def image(tmp_path):
    """A root file system with symlinks that point at the host, and a host directory."""
    root, host = tmp_path / "root", tmp_path / "host"
    (root / "usr" / "lib").mkdir(parents=True)
    (root / "etc").mkdir()
    (root / "lib").symlink_to("usr/lib")
    (root / "opt").mkdir()
    host.mkdir()
    (host / "precious").write_text("mine\n")
    (root / "opt" / "abs").symlink_to(host)
    (root / "opt" / "rel").symlink_to("../../../../../../.." + str(host))
    (root / "etc" / "planted.conf").symlink_to(host / "precious")
    return root, host


@pytest.fixture
def sources(tmp_path):
    lib = tmp_path / "libx.so.1"
    lib.write_text("library\n")
    lib.chmod(0o755)
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "a").write_text("a\n")
    (tree / "link").symlink_to("sub/a")
    return lib, tree


def untouched(host):
    assert sorted(os.listdir(host)) == ["precious"]
    assert (host / "precious").read_text() == "mine\n"


@pytest.mark.parametrize("link", ["abs", "rel"])
def test_a_copy_through_an_image_symlink_lands_inside_the_root(image, sources, link):
    root, host = image
    hook.copy_into(root, str(sources[0]), f"/opt/{link}/libx.so.1")
    untouched(host)
    copied = root / str(host).lstrip("/") / "libx.so.1"
    assert copied.read_text() == "library\n" and oct(copied.stat().st_mode & 0o777) == "0o755"


def test_a_symlink_at_the_target_is_replaced_not_followed(image, sources):
    root, host = image
    hook.copy_into(root, str(sources[0]), "/etc/planted.conf")
    untouched(host)
    assert not (root / "etc" / "planted.conf").is_symlink()
    assert (root / "etc" / "planted.conf").read_text() == "library\n"


def test_merged_usr_symlinks_are_followed_inside(image, sources):
    root, _ = image
    hook.copy_into(root, str(sources[0]), "/lib/x86_64-linux-gnu/libx.so.1")
    assert (root / "usr" / "lib" / "x86_64-linux-gnu" / "libx.so.1").read_text() == "library\n"


def test_a_tree_is_merged_through_symlinks_inside(image, sources):
    root, host = image
    hook.copy_into(root, str(sources[1]), "/opt/abs/tree")
    untouched(host)
    inside = root / str(host).lstrip("/") / "tree"
    assert (inside / "sub" / "a").read_text() == "a\n"
    assert os.readlink(inside / "link") == "sub/a"


def test_the_root_itself_and_directories_are_refused(image, sources):
    root, _ = image
    with pytest.raises(hook.CopyError, match="root"):
        hook.copy_into(root, str(sources[0]), "/../..")
    with pytest.raises(hook.CopyError, match="/usr/lib is a directory"):
        hook.copy_into(root, str(sources[0]), "/usr/lib")


def test_static_and_dynamic_programs():
    assert hook.is_static("/sbin/ldconfig")  # Debian's, like every glibc's
    assert not hook.is_static(shutil.which("ls"))
    assert not hook.is_static(__file__)


def test_run_hook_copies_for_enabled_modules_only(image, sources, tmp_path):
    root, host = image
    modules = tmp_path / "modules.d"
    modules.mkdir()
    (modules / "a.yaml").write_text(f"name: a\nenv: ENABLE_A\ncopy:\n  - {sources[0]}:/opt/abs/\n")
    (modules / "b.yaml").write_text(f"name: b\nenv: ENABLE_B\ncopy:\n  - {sources[0]}:/opt/b/\n")
    config = {"root": {"path": str(root)}, "process": {"env": ["ENABLE_A=1", f"PODMANHPC_MODULES_DIR={modules}"]}}
    done = hook.run_hook({"bundle": str(tmp_path)}, config, {})
    assert done == [f"a: copied {sources[0]} to /opt/abs/libx.so.1"]  # no /sbin/ldconfig: no cache
    untouched(host)
    assert not (root / "opt" / "b").exists()


def in_user_namespace(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run Python ``code`` as root of a new user namespace (where the hook runs, in podman's)."""
    if shutil.which("unshare") is None:
        pytest.fail("util-linux's unshare is needed")
    return subprocess.run(
        ["unshare", "-r", sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


def test_the_library_cache_is_built_by_the_host_ldconfig_inside_the_root(image, tmp_path):
    root, host = image
    marker = tmp_path / "ran"
    (root / "sbin").mkdir()
    (root / "sbin" / "ldconfig").write_text(f"#!/bin/sh\necho ran > {marker}\n")
    (root / "sbin" / "ldconfig").chmod(0o755)
    (root / "etc" / "ld.so.conf").write_text("/opt/abs\n")
    lib = root / str(host).lstrip("/")
    lib.mkdir(parents=True)
    shutil.copy("/lib/x86_64-linux-gnu/libz.so.1", lib / "libz.so.1")
    result = in_user_namespace(
        "import sys; from jupyter_podman_hpc.engine.site import hook; print(hook.refresh_library_cache(sys.argv[1]))",
        str(root),
    )
    assert result.stdout.strip() == "library cache refreshed by the host's /sbin/ldconfig", result.stderr
    assert not marker.exists()  # the image's ldconfig never ran
    untouched(host)
    cache = (root / "etc" / "ld.so.cache").read_bytes()
    assert b"/opt/abs/libz.so.1" in cache  # found through the image's symlink, inside the root
