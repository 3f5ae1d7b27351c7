"""The Slurm uid shim: built 0500 in a private cache directory, replaced when it is not safe."""

import logging
import os
import stat

import pytest

from jupyter_podman_hpc.kernels import slurm


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
    assert sorted(os.listdir(os.path.dirname(shim))) == sorted([os.path.basename(shim),
                                                                os.path.basename(shim)[:-3] + ".lock"])
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
