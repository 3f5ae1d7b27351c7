"""An unpacked copy made with the real unsquashfs: once per node, shared, room made for it
(oldest unused copies first), refused when there is none, and recorded as its job's."""

import shutil
import time

import pytest

from jupyter_podman_hpc.engine.mount.cache import cache_entries, copies
from jupyter_podman_hpc.engine.mount.unpack import NoRoom, UnpackedCopy
from jupyter_podman_hpc.engine.site.readpath import ReadPathSettings
from tests.helpers.squash_files import age, made_copy, needs_squashfs, squash_file


@needs_squashfs
def test_a_copy_is_unpacked_once_and_shared(tmp_path):
    squash = squash_file(tmp_path, "one")
    first, second = (UnpackedCopy(squash, tmp_path / "cache", 2**30) for _ in range(2))
    root = first.acquire()
    assert (root / "etc" / "hello").read_text() == "one"
    inode = root.stat().st_ino
    assert second.acquire().stat().st_ino == inode  # not unpacked again
    first.release()
    second.release()
    assert [key for key, size, _ in cache_entries(tmp_path / "cache")] == [first.key]
    assert cache_entries(tmp_path / "cache")[0][1] > 1000  # its size is recorded


@needs_squashfs
def test_a_copy_removed_from_outside_is_unpacked_again_and_said_lost(tmp_path):
    squash = squash_file(tmp_path, "one")
    first = UnpackedCopy(squash, tmp_path / "cache", 2**30)
    assert not first.lost
    shutil.rmtree(first.acquire())  # someone else's rm -rf, while a container holds it
    again = UnpackedCopy(squash, tmp_path / "cache", 2**30)
    assert (again.acquire() / "etc" / "hello").read_text() == "one" and again.lost
    first.release()
    again.release()


@needs_squashfs
def test_unused_copies_are_evicted_oldest_first_and_used_ones_never(tmp_path):
    cache = tmp_path / "cache"
    squashes = [squash_file(tmp_path, name, 200_000) for name in ("a", "b", "c")]
    budget = squashes[0].stat().st_size * 3 * 3 // 2  # room for one estimate and one copy
    held = UnpackedCopy(squashes[0], cache, budget)
    held.acquire()
    old = UnpackedCopy(squashes[1], cache, budget)
    old.acquire()
    old.release()
    new = UnpackedCopy(squashes[2], cache, budget)
    new.acquire()
    keys = {key for key, _, _ in cache_entries(cache)}
    assert keys == {held.key, new.key}  # b, unused, made room; a, in use, stayed
    [(key, why)] = new.removed  # for the mount program's note (infohpc)
    assert key == old.key and why.startswith("room for c.squash (")
    assert (held.root / "etc" / "hello").read_text() == "a"
    new.release()
    held.release()


@needs_squashfs
def test_no_room_is_refused_so_the_caller_falls_back(tmp_path):
    squash = squash_file(tmp_path, "big", 300_000)
    with pytest.raises(NoRoom, match="squash_unpack_max_mb"):
        UnpackedCopy(squash, tmp_path / "cache", 1000).acquire()
    budget = squash.stat().st_size * 3 + 1024
    held = UnpackedCopy(squash, tmp_path / "cache", budget)
    held.acquire()
    other = squash_file(tmp_path, "other", 300_000)
    with pytest.raises(NoRoom, match="in use by other images"):
        UnpackedCopy(other, tmp_path / "cache", budget).acquire()
    held.release()


@needs_squashfs
def test_a_killed_unpack_leaves_nothing_that_the_next_one_keeps(tmp_path):
    squash = squash_file(tmp_path, "one")
    cache = tmp_path / "cache"
    (cache / "0123.tmp-99999" / "half").mkdir(parents=True)
    copy = UnpackedCopy(squash, cache, 2**30)
    copy.acquire()
    assert not list(cache.glob("*.tmp-*"))
    copy.release()


@needs_squashfs
def test_over_the_login_budget_the_message_names_the_login_key(tmp_path):
    squash = squash_file(tmp_path, "big", 300_000)
    login = ReadPathSettings("unpacked", str(tmp_path / "cache"), 0.001, 30.0, "")
    with pytest.raises(NoRoom, match=r"more than squash_unpack_login_max_mb \(0 MiB\)"):
        UnpackedCopy(squash, tmp_path / "cache", 1000, settings=login).acquire()


@needs_squashfs
def test_a_copy_records_who_made_it_and_release_is_its_last_use(tmp_path):
    copy = made_copy(tmp_path, "one", job="77")
    age(copy, 10)
    [listed] = copies(tmp_path / "cache")
    assert (listed.key, listed.in_use, listed.job, listed.squash) == (copy.key, True, "77", str(copy.squash))
    assert listed.bytes > 1000 and listed.node
    copy.release()
    [listed] = copies(tmp_path / "cache")
    assert not listed.in_use and time.time() - listed.last_use < 60


@needs_squashfs
def test_a_copy_used_again_by_a_later_job_becomes_that_jobs(tmp_path):
    first = made_copy(tmp_path, "one", job="20")
    first.release()
    again = UnpackedCopy(
        first.squash,
        tmp_path / "cache",
        2**30,
        settings=ReadPathSettings("auto", str(tmp_path / "cache"), 1024, 30.0, "21"),
    )
    again.acquire()
    [listed] = copies(tmp_path / "cache")
    assert listed.job == "21" and listed.bytes > 1000
    again.release()
