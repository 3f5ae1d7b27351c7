"""The read path's pieces: settings, kernel overlay options, and the node-local cache of
unpacked copies (with real mksquashfs / unsquashfs)."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.config import load_config
from jupyter_podman_hpc.engine.errors import ConfigError
from jupyter_podman_hpc.engine.readpath import (NoRoom, ReadPathSettings, UnpackedCopy, budget_mb, cache_entries,
                                                cgroup_limits, copies, kernel_options, memory_bytes, sweep)

needs_squashfs = pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("unsquashfs")),
                                    reason="squashfs-tools are not installed")


def test_podman_options_become_kernel_overlay_options_with_userxattr():
    options = ["lowerdir=l/A:l/B,upperdir=/g/x/diff,workdir=/g/x/work,,volatile"]
    assert kernel_options(options, ["/c/a", "/c/b"]) == \
        "lowerdir=/c/a:/c/b,upperdir=/g/x/diff,workdir=/g/x/work,volatile,userxattr"


def test_an_option_only_fuse_overlayfs_has_keeps_fuse_overlayfs():
    assert kernel_options(["lowerdir=l/A,upperdir=u,workdir=w,uidmapping=0:1000:1"], ["/c/a"]) is None


def test_settings_travel_to_the_mount_program_through_podmans_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("squash_read_path: kernel\nsquash_unpack_max_mb: 512\n")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")  # a compute node's budget
    config = load_config()
    settings = ReadPathSettings.from_env(config.podman_env({}))
    assert settings == ReadPathSettings("kernel", f"/dev/shm/{os.getuid()}_hpc/unpacked", 512.0, 30.0, "1234")
    assert settings.kernel_overlay and not settings.unpacks
    assert ReadPathSettings.from_env({}).mode == "auto"


def test_an_unknown_read_path_is_a_one_line_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_SQUASH_READ_PATH", "fastest")
    with pytest.raises(ConfigError, match="squash_read_path .* must be one of auto, unpacked, kernel, fuse"):
        load_config()


def _squash(tmp_path: Path, name: str, size: int = 1000) -> Path:
    tree = tmp_path / f"{name}-tree"
    (tree / "etc").mkdir(parents=True)
    (tree / "etc" / "hello").write_text(name)
    (tree / "blob").write_bytes(os.urandom(size))
    target = tmp_path / f"{name}.squash"
    subprocess.run(["mksquashfs", str(tree), str(target), "-comp", "lz4", "-quiet", "-no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    return target


@needs_squashfs
def test_a_copy_is_unpacked_once_and_shared(tmp_path):
    squash = _squash(tmp_path, "one")
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
def test_unused_copies_are_evicted_oldest_first_and_used_ones_never(tmp_path):
    cache = tmp_path / "cache"
    squashes = [_squash(tmp_path, name, 200_000) for name in ("a", "b", "c")]
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
    squash = _squash(tmp_path, "big", 300_000)
    with pytest.raises(NoRoom, match="squash_unpack_max_mb"):
        UnpackedCopy(squash, tmp_path / "cache", 1000).acquire()
    budget = squash.stat().st_size * 3 + 1024
    held = UnpackedCopy(squash, tmp_path / "cache", budget)
    held.acquire()
    other = _squash(tmp_path, "other", 300_000)
    with pytest.raises(NoRoom, match="in use by other images"):
        UnpackedCopy(other, tmp_path / "cache", budget).acquire()
    held.release()


@needs_squashfs
def test_a_killed_unpack_leaves_nothing_that_the_next_one_keeps(tmp_path):
    squash = _squash(tmp_path, "one")
    cache = tmp_path / "cache"
    (cache / "0123.tmp-99999" / "half").mkdir(parents=True)
    copy = UnpackedCopy(squash, cache, 2**30)
    copy.acquire()
    assert not list(cache.glob("*.tmp-*"))
    copy.release()


# --- the cache's policy: budget, idle time, job end, login nodes -------------------------


def test_the_budget_is_mib_or_a_share_of_memory():
    assert budget_mb("512") == 512.0 and budget_mb(0.5) == 0.5
    assert budget_mb("10%", memory=64 * 2**30) == 6553.6
    assert budget_mb(" 5% ", memory=2**30) == 51.2
    for bad in ("lots", "0", "-1", "0%", "150%", "%"):
        with pytest.raises(ValueError):
            budget_mb(bad, memory=2**30)


def test_the_default_budget_is_a_tenth_of_this_nodes_memory(monkeypatch, tmp_path):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    config = load_config()
    assert config.squash_unpack_max_mb == "10%" and config.sources["squash_unpack_max_mb"] == "default"
    assert config.read_path.unpack_max_mb == round(memory_bytes() / 10 / 2**20, 1)
    assert 0 < memory_bytes() <= int(Path("/proc/meminfo").read_text().split()[1]) * 1024


def test_a_bad_budget_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv("PODMANHPC_SQUASH_UNPACK_MAX_MB", "half")
    with pytest.raises(ConfigError, match=r"squash_unpack_max_mb \(env: PODMANHPC_SQUASH_UNPACK_MAX_MB\) must be "
                                          r"a positive number of MiB or a share of memory such as 10%, not 'half'"):
        load_config()


def test_a_memory_cgroup_limit_below_the_nodes_memory_is_the_base(tmp_path):
    v2 = tmp_path / "v2"
    (v2 / "slurm" / "job_7" / "step_0").mkdir(parents=True)
    (v2 / "slurm" / "job_7" / "memory.max").write_text("8589934592\n")
    (v2 / "slurm" / "job_7" / "step_0" / "memory.max").write_text("max\n")
    (tmp_path / "cg2").write_text("0::/slurm/job_7/step_0\n")
    assert cgroup_limits(str(tmp_path / "cg2"), str(v2)) == [8589934592]
    v1 = tmp_path / "v1"
    (v1 / "memory" / "slurm" / "uid_1" / "job_7").mkdir(parents=True)
    (v1 / "memory" / "slurm" / "uid_1" / "job_7" / "memory.limit_in_bytes").write_text("4294967296\n")
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cg1").write_text("9:pids:/\n4:memory:/slurm/uid_1/job_7\n")
    assert sorted(cgroup_limits(str(tmp_path / "cg1"), str(v1))) == [4294967296, 9223372036854771712]
    (tmp_path / "cg0").write_text("9:pids:/\n")
    assert cgroup_limits(str(tmp_path / "cg0"), str(v1)) == []


@pytest.mark.parametrize("job, mode, unpacks", [
    ("", "auto", False),  # a login node: squashfuse's page cache, not a tmpfs copy
    ("", "unpacked", True),  # unless asked
    ("", "kernel", False),
    ("4242", "auto", True),  # a compute node in a job
    ("4242", "kernel", False),
])
def test_a_login_node_unpacks_only_when_asked(monkeypatch, tmp_path, job, mode, unpacks):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text(f"squash_read_path: {mode}\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    config = load_config()
    settings = ReadPathSettings.from_env(config.podman_env({}))  # as the mount program sees it
    assert (settings.job, settings.login_node, settings.unpacks) == (job, not job, unpacks)
    assert config.read_path.unpacks == unpacks


def test_a_mount_program_not_told_where_it_runs_unpacks_as_before():
    settings = ReadPathSettings.from_env({"PODMANHPC_SQUASH_UNPACK_DIR": "/dev/shm/x"})
    assert settings.job is None and settings.unpacks and settings.idle_minutes == 30.0


def _made(tmp_path: Path, name: str, job: str = "", cache: str = "cache") -> UnpackedCopy:
    copy = UnpackedCopy(_squash(tmp_path, name), tmp_path / cache, 2**30,
                        settings=ReadPathSettings("auto", str(tmp_path / cache), 1024, 30.0, job))
    copy.acquire()
    return copy


def _age(copy: UnpackedCopy, minutes: float) -> None:
    then = time.time() - minutes * 60
    os.utime(copy.ref_path, (then, then))


@needs_squashfs
def test_a_copy_records_who_made_it_and_release_is_its_last_use(tmp_path):
    copy = _made(tmp_path, "one", job="77")
    _age(copy, 10)
    [listed] = copies(tmp_path / "cache")
    assert (listed.key, listed.in_use, listed.job, listed.squash) == (copy.key, True, "77", str(copy.squash))
    assert listed.bytes > 1000 and listed.node
    copy.release()
    [listed] = copies(tmp_path / "cache")
    assert not listed.in_use and time.time() - listed.last_use < 60


@needs_squashfs
def test_unused_copies_idle_past_the_limit_go_at_the_next_use_and_copies_in_use_never(tmp_path):
    cache = tmp_path / "cache"
    idle, held = _made(tmp_path, "idle"), _made(tmp_path, "held")
    idle.release()
    recent = _made(tmp_path, "recent")
    recent.release()
    _age(idle, 31)
    _age(held, 90)  # in use for an hour and a half: stays
    _age(recent, 29)
    newcomer = _made(tmp_path, "new")  # the next mount-program call sweeps
    assert [key for key, _ in newcomer.removed] == [idle.key]
    assert {key for key, _, _ in cache_entries(cache)} == {held.key, recent.key, newcomer.key}
    assert not idle.root.exists() and (held.root / "etc" / "hello").read_text() == "held"
    settings = ReadPathSettings("auto", str(cache), 1024, 30.0, "")
    assert sweep(cache, settings) == []
    _age(recent, 31)
    [(key, why)] = sweep(cache, settings)
    assert key == recent.key and why == "unused for 31.0 min, more than squash_unpack_idle_minutes (30)"
    held.release()
    newcomer.release()


@needs_squashfs
def test_a_copy_of_a_job_that_has_ended_goes_at_the_next_use_on_the_node(tmp_path):
    cache = tmp_path / "cache"
    old, running, mine = _made(tmp_path, "old", job="10"), _made(tmp_path, "running", job="11"), \
        _made(tmp_path, "mine", job="12")
    inside = _made(tmp_path, "inside", job="10")  # still held: the job's container has not gone yet
    for copy in (old, running, mine):
        copy.release()
    asked = []

    def ended(job: str) -> bool:
        asked.append(job)
        return job == "10"

    removed = sweep(cache, ReadPathSettings("auto", str(cache), 1024, 30.0, "12"), ended=ended)
    assert removed == [(old.key, "made by job 10, which has ended")]
    assert sorted(asked) == ["10", "11"]  # once per job, and never our own
    assert {key for key, _, _ in cache_entries(cache)} == {running.key, mine.key, inside.key}
    inside.release()


@needs_squashfs
def test_a_copy_used_again_by_a_later_job_becomes_that_jobs(tmp_path):
    first = _made(tmp_path, "one", job="20")
    first.release()
    again = UnpackedCopy(first.squash, tmp_path / "cache", 2**30,
                         settings=ReadPathSettings("auto", str(tmp_path / "cache"), 1024, 30.0, "21"))
    again.acquire()
    [listed] = copies(tmp_path / "cache")
    assert listed.job == "21" and listed.bytes > 1000
    again.release()


@needs_squashfs
def test_the_sweep_holds_the_copies_to_the_budget_oldest_unused_first(tmp_path):
    cache = tmp_path / "cache"
    made = [_made(tmp_path, name) for name in ("a", "b", "c", "d")]
    for copy in made[1:]:
        copy.release()
    for minutes, copy in zip((9, 8, 7, 1), made):
        _age(copy, minutes)
    size = cache_entries(cache)[0][1]
    budget = ReadPathSettings("auto", str(cache), 2.5 * size / 2**20, 30.0, "")
    removed = sweep(cache, budget)
    # a is the oldest but in use; b and c go, d (the newest) fits with a
    assert [key for key, _ in removed] == [made[1].key, made[2].key]
    assert all("over squash_unpack_login_max_mb" in why for _, why in removed)  # job "": a login node
    assert {key for key, _, _ in cache_entries(cache)} == {made[0].key, made[3].key}
    made[0].release()


@pytest.mark.parametrize("job, budget", [("", 2048.0), ("99", None)])
def test_a_login_node_has_a_budget_of_its_own_when_asked_to_unpack(monkeypatch, tmp_path, job, budget):
    monkeypatch.setenv("PODMANHPC_CONFIG_FILE", str(tmp_path / "none.yaml"))
    (tmp_path / "none.yaml").write_text("squash_read_path: unpacked\n")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    if job:
        monkeypatch.setenv("SLURM_JOB_ID", job)
    config = load_config()
    assert config.budget_key == (("squash_unpack_max_mb", "10%") if job else ("squash_unpack_login_max_mb", "2048"))
    expected = budget if budget is not None else round(memory_bytes() / 10 / 2**20, 1)
    assert ReadPathSettings.from_env(config.podman_env({})).unpack_max_mb == expected


@needs_squashfs
def test_over_the_login_budget_the_message_names_the_login_key(tmp_path):
    squash = _squash(tmp_path, "big", 300_000)
    login = ReadPathSettings("unpacked", str(tmp_path / "cache"), 0.001, 30.0, "")
    with pytest.raises(NoRoom, match=r"more than squash_unpack_login_max_mb \(0 MiB\)"):
        UnpackedCopy(squash, tmp_path / "cache", 1000, settings=login).acquire()


@needs_squashfs
def test_a_jobs_last_step_releases_its_own_unused_copies_only(tmp_path):
    cache = tmp_path / "cache"
    own, held, other = _made(tmp_path, "own", job="30"), _made(tmp_path, "held", job="30"), \
        _made(tmp_path, "other", job="31")
    own.release()
    other.release()
    settings = ReadPathSettings("auto", str(cache), 1024, 30.0, "30")
    assert sweep(cache, settings, ended=lambda job: False) == []  # not without being asked
    removed = sweep(cache, settings, ended=lambda job: False, release_job=True)
    assert removed == [(own.key, "released at the end of job 30")]
    assert {key for key, _, _ in cache_entries(cache)} == {held.key, other.key}
    held.release()
