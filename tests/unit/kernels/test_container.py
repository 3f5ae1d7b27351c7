"""A kernel container's command-line pieces: networks named, directories chosen, paths refused."""

import pytest

from jupyter_podman_hpc.kernels.container import KernelStartError, networks, outermost, volumes


def test_networks_are_found_in_every_spelling():
    assert networks(["--network", "host", "--net=none", "-e", "X", "--network=a"]) == ["host", "none", "a"]
    assert networks(["--rm"]) == []


def test_only_the_outermost_existing_directories_are_mounted_never_the_root(tmp_path):
    inner = tmp_path / "a" / "b"
    inner.mkdir(parents=True)
    assert outermost([str(inner), str(tmp_path / "a"), str(tmp_path / "missing"), "/"]) == [str(tmp_path / "a")]


def test_a_path_podman_would_split_is_a_one_line_error():
    assert volumes(["/x"], "/opt/boot.py") == ["--volume", "/x:/opt/boot.py:ro"]
    with pytest.raises(KernelStartError, match="':' and ',' are not allowed"):
        volumes(["/home/a:b"])
