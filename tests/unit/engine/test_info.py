"""The infohpc report's lines that need no podman (the rest runs on the stack:
tests/integration/engine/test_unpack_policy.py)."""

from types import SimpleNamespace

from jupyter_podman_hpc.engine.info import unpacked_copies
from jupyter_podman_hpc.engine.site.config import SiteConfig


class NoPodman:
    def __getattr__(self, name):
        raise AssertionError(f"podman.{name} called for an empty unpack cache")


def test_an_empty_or_missing_unpack_cache_is_one_line_without_asking_podman(tmp_path):
    for cache in (tmp_path / "missing", tmp_path):
        site = SimpleNamespace(config=SiteConfig(squash_unpack_dir=str(cache)), podman=NoPodman())
        assert list(unpacked_copies(site)) == [f" unpacked copies: none in {cache}"]
        assert list(unpacked_copies(site, release_job=True)) == [f" unpacked copies: none in {cache}"]
