"""The Slurm uid shim: built 0500 in a private cache directory, replaced when it is not safe; the user's
host ids compiled in."""

import logging
import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.site import hostslurm as slurm


@pytest.fixture
def environ(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    return {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}


def test_the_shim_is_built_0500_in_a_private_directory_and_reused(environ):
    shim = slurm.uid_shim(environ)
    assert shim is not None and shim.startswith(environ["HOME"] + "/.cache/podman-hpc/slurm-uid-")
    st = os.lstat(shim)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o500
    assert stat.S_IMODE(os.stat(os.path.dirname(shim)).st_mode) == 0o700
    assert sorted(os.listdir(os.path.dirname(shim))) == sorted(
        [os.path.basename(shim), os.path.basename(shim)[:-3] + ".lock"]
    )
    assert slurm.uid_shim(environ) == shim and os.lstat(shim).st_ino == st.st_ino  # not rebuilt


def test_a_symlink_or_a_writable_file_in_its_place_is_replaced(environ, tmp_path):
    shim = slurm.uid_shim(environ)
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_text("not a shim\n")
    os.chmod(shim, 0o700)
    os.unlink(shim)
    os.symlink(elsewhere, shim)
    assert slurm.uid_shim(environ) == shim
    assert not os.path.islink(shim) and elsewhere.read_text() == "not a shim\n"
    os.chmod(shim, 0o777)
    assert slurm.uid_shim(environ) == shim and stat.S_IMODE(os.lstat(shim).st_mode) == 0o500


def test_a_cache_directory_others_could_write_gives_no_shim(environ, caplog):
    cache = slurm.cache_dir(environ)
    cache.mkdir(parents=True)
    cache.chmod(0o777)
    with caplog.at_level(logging.WARNING):
        assert slurm.uid_shim(environ) is None
    assert "others may have written into it" in caplog.text
    assert os.listdir(cache) == []


def ids_under_shim(shim: str, *prefix: str) -> tuple[int, int]:
    """What ``id -u`` and ``id -g`` answer with ``shim`` preloaded (``prefix``: e.g. a user namespace)."""
    answers = [
        subprocess.run(
            [*prefix, "env", f"LD_PRELOAD={shim}", "id", flag], capture_output=True, text=True, check=True
        ).stdout
        for flag in ("-u", "-g")
    ]
    return int(answers[0]), int(answers[1])


def test_the_host_ids_are_compiled_in_whatever_the_namespace(environ, monkeypatch):
    monkeypatch.setattr(slurm, "host_ids", lambda: slurm.HostIds(4242, 4343))
    shim = slurm.uid_shim(environ)
    assert ids_under_shim(shim) == (4242, 4343)
    # in a user namespace of its own (the kernel's with --userns=keep-id is one below podman's)
    assert ids_under_shim(shim, "unshare", "--user", "--map-root-user") == (4242, 4343)


def test_each_users_and_groups_ids_get_a_shim_of_their_own(environ, monkeypatch):
    monkeypatch.setattr(slurm, "host_ids", lambda: slurm.HostIds(4242, 4343))
    first = slurm.uid_shim(environ)
    monkeypatch.setattr(slurm, "host_ids", lambda: slurm.HostIds(4242, 4344))
    second = slurm.uid_shim(environ)
    assert first != second and ids_under_shim(second) == (4242, 4344) and ids_under_shim(first) == (4242, 4343)


def test_built_without_ids_the_shim_maps_one_level(tmp_path):
    """A shim built by hand (no -D) reads /proc/self/uid_map: right one level below the host only."""
    shim = tmp_path / "uid.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), str(slurm.SOURCE)], check=True)
    assert ids_under_shim(str(shim), "unshare", "--user", "--map-root-user") == (os.getuid(), os.getgid())
    assert ids_under_shim(str(shim)) == (os.getuid(), os.getgid())


def test_the_users_passwd_entry_is_answered_where_the_system_has_none(environ, monkeypatch):
    """An image's /etc/passwd lacks the user when its root is the user: `squeue --me` looks the uid up."""
    monkeypatch.setattr(slurm, "host_ids", lambda: slurm.HostIds(4242, 4343, "jph-shim-user", "/home/jph-shim-user"))
    shim = slurm.uid_shim(environ)
    lookups = (
        "import pwd; print(pwd.getpwuid(4242)[:], pwd.getpwnam('jph-shim-user').pw_uid, "
        "pwd.getpwuid(0).pw_name)"
    )  # the reentrant forms; getent below uses getpwuid()
    env = {**os.environ, "LD_PRELOAD": shim}
    out = subprocess.run([sys.executable, "-c", lookups], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "('jph-shim-user', '*', 4242, 4343, '', '/home/jph-shim-user', '/bin/sh') 4242 root"
    getent = subprocess.run(["getent", "passwd", "4242"], env=env, capture_output=True, text=True).stdout
    assert getent == "jph-shim-user:*:4242:4343::/home/jph-shim-user:/bin/sh\n"
    assert subprocess.run(["getent", "passwd", "4242"], capture_output=True).returncode == 2  # not without it


def test_an_entry_the_system_has_wins_and_odd_names_are_left_out(environ, monkeypatch):
    me = pwd.getpwuid(os.getuid())
    monkeypatch.setattr(slurm, "host_ids", lambda: slurm.HostIds(me.pw_uid, me.pw_gid, "someone-else", "/nowhere"))
    shim = slurm.uid_shim(environ)
    env = {**os.environ, "LD_PRELOAD": shim}
    got = subprocess.run(["getent", "passwd", str(me.pw_uid)], env=env, capture_output=True, text=True).stdout
    assert got.split(":")[0] == me.pw_name
    # what cannot go into a C string as it is gives ids only
    assert slurm.HostIds(1, 2, 'a"b', "/h").defines() == ["-DPODMANHPC_HOST_UID=1", "-DPODMANHPC_HOST_GID=2"]
    assert len(slurm.HostIds(1, 2, "ab", "/h\\").defines()) == 2


def test_the_host_ids_are_this_processs():
    me = pwd.getpwuid(os.getuid())
    assert slurm.host_ids() == slurm.HostIds(os.getuid(), os.getgid(), me.pw_name, me.pw_dir)


def test_a_container_with_the_slurm_module_gets_the_shim_built_unless_one_is_named(environ, tmp_path):
    """`podman-hpc run --slurm` as a kernel: the module's bind rule mounts the user's own shim."""
    from jupyter_podman_hpc.engine.site.modules import ModuleSet

    site = Path(slurm.__file__).parent / "data" / "modules.d"
    modules = ModuleSet.load(str(site))
    chosen = modules.select([slurm.MODULE])
    args = modules.podman_args(chosen, environ)
    [bind] = [arg for arg in args if arg.endswith(":/opt/podman-hpc/slurm/uid.so:ro")]
    built = bind.split(":")[0]
    assert built.startswith(environ["HOME"] + "/.cache/podman-hpc/slurm-uid-") and os.path.isfile(built)
    named = tmp_path / "site-shim.so"
    named.write_bytes(b"")
    args = modules.podman_args(chosen, {**environ, slurm.SHIM_VARIABLE: str(named)})
    assert f"{named}:/opt/podman-hpc/slurm/uid.so:ro" in args
