"""The node-local cache of unpacked copies: what it holds (one ref file a copy), which copies
are in use, and its policy (``sweep``): which unused copies go.

Unpacked copies (``engine/mount/unpack.py`` makes them) are a node-local cache, as
podman's own graph root is: kept after their last container so that the next
step starts at once, bounded by ``squash_unpack_max_mb`` (the least recently
used unused copy goes first).

A copy is RAM (tmpfs, charged to the memory cgroup of the job that wrote it,
and kept after that job), so the cache has a policy (``sweep``): the budget
(``engine/site/readpath.py``'s ``budget_mb``); an unused copy whose last use is
older than ``squash_unpack_idle_minutes`` (30) is removed, and so is an
unused one made by a Slurm job that has ended, at the next mount-program call
or ``infohpc`` of its user on the node (no daemon: nothing runs between
them).

    python -m jupyter_podman_hpc.engine.mount.cache sweep [--release-job]   (in podman unshare; JSON)
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from ..base import commands
from ..base.locks import flocked
from ..base.private import own_dir
from ..site.readpath import ReadPathSettings, budget_key


def write_ref(fd: int, size: int, meta: dict) -> None:
    """A copy's ref file: the tree's size on its first line (``cache_entries``), then who made it."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{size}\n{json.dumps(meta)}\n".encode(), 0)


def cache_entries(cache: Path) -> list[tuple[str, int, float]]:
    """(key, bytes, last use) of every copy in the cache."""
    return [(key, size, last) for key, size, last, _ in _refs(cache)]


def _refs(cache: Path) -> list[tuple[str, int, float, dict]]:
    """(key, bytes, last use, who made it) of every copy, each ref file read once."""
    entries = []
    for ref in cache.glob("*.ref"):
        try:
            text, last = ref.read_text(), ref.stat().st_mtime
            entries.append((ref.stem, int(text.partition("\n")[0] or 0), last, _meta(text)))
        except (OSError, ValueError):
            continue
    return entries


def size_of(ref: Path) -> int:
    """The bytes of the copy a ref file stands for (its first line; 0 when empty)."""
    return int(ref.read_text().partition("\n")[0] or 0)


def read_meta(ref: Path) -> dict:
    """What the ref file says of its copy (squash file, job, node); {} for a copy made before."""
    try:
        return _meta(ref.read_text())
    except OSError:
        return {}


def _meta(text: str) -> dict:
    try:
        meta = json.loads(text.partition("\n")[2] or "{}")
    except ValueError:
        return {}
    return meta if isinstance(meta, dict) else {}


@dataclass(frozen=True)
class CachedCopy:
    """One unpacked copy, as ``infohpc`` shows it."""

    key: str
    bytes: int
    last_use: float
    in_use: bool
    squash: str = ""
    job: str = ""
    node: str = ""


def copies(cache: Path) -> list[CachedCopy]:
    """Every copy in the cache, least recently used first."""
    found = [
        CachedCopy(
            key,
            size,
            last,
            in_use(cache, key),
            **{k: str(v) for k, v in meta.items() if k in ("squash", "job", "node")},
        )
        for key, size, last, meta in _refs(cache)
    ]
    return sorted(found, key=lambda c: c.last_use)


def sweep(
    cache: Path,
    settings: ReadPathSettings,
    keep: Collection[str] = frozenset(),
    now: float | None = None,
    ended: Callable[[str], bool] | None = None,
    release_job: bool = False,
) -> list[tuple[str, str]]:
    """Remove the unused copies idle past ``settings.idle_minutes`` or made by a Slurm job that
    has ended (``ended(job)``, default: asks Slurm), then the least recently used unused ones
    while the copies take more than the budget; (key, why) of each. Call under the cache lock.
    A copy in use, or in ``keep``, stays. ``release_job``: this job is ending (its last step),
    its own unused copies go too."""
    now = time.time() if now is None else now
    ended = job_ended if ended is None else ended
    answers: dict[str, bool] = {}
    removed = []
    found = copies(cache)
    over = sum(copy.bytes for copy in found) - settings.unpack_max_mb * 2**20
    for copy in found:
        if copy.key in keep or copy.in_use:
            continue
        why = ""
        if now - copy.last_use > settings.idle_minutes * 60:
            why = (
                f"unused for {(now - copy.last_use) / 60:.1f} min, more than squash_unpack_idle_minutes "
                f"({settings.idle_minutes:g})"
            )
        elif release_job and copy.job and copy.job == settings.job:
            why = f"released at the end of job {copy.job}"
        elif copy.job and copy.job != settings.job:
            if copy.job not in answers:
                answers[copy.job] = ended(copy.job)
            if answers[copy.job]:
                why = f"made by job {copy.job}, which has ended"
        if not why and over > 0:  # oldest first: ``copies`` is in order of last use
            why = f"over {budget_key(settings)} ({settings.unpack_max_mb:g} MiB)"
        if why:
            evict(cache, copy.key)
            removed.append((copy.key, why))
            over -= copy.bytes
    return removed


def sweep_cache(settings: ReadPathSettings, release_job: bool = False) -> list[tuple[str, str]]:
    """``sweep`` the user's cache on this node under its lock (from the mount program or
    ``infohpc``, inside podman's user namespace, where the trees' files can be removed)."""
    cache = Path(settings.unpack_dir) if settings.unpack_dir else None
    if cache is None or not any(cache.glob("*.ref")):
        return []
    own_dir(cache)
    with flocked(cache / ".lock", 0o600):
        return sweep(cache, settings, release_job=release_job)


def sweep_unused(settings: ReadPathSettings) -> None:
    """The mount program's sweep where it will not unpack (an unpack sweeps under its own
    lock): a login node's or a ``kernel``/``fuse`` node's old copies go too. Never fails a mount."""
    if settings.unpacks:
        return
    try:
        sweep_cache(settings)
    except Exception:  # noqa: BLE001 - an unsafe or unreadable cache: infohpc says so, the mount goes on
        pass


def job_ended(job: str) -> bool:
    """True once Slurm no longer lists ``job`` as pending, running or completing; False while it
    does, and whenever Slurm cannot say (then the idle time applies)."""
    squeue = shutil.which("squeue")
    if not squeue or not job.isdigit():
        return False
    try:
        result = commands.run([squeue, "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    if result.returncode != 0:
        return "Invalid job id" in result.stderr
    return result.stdout.strip() == ""  # squeue lists a job until it has completed


def in_use(cache: Path, key: str) -> bool:
    """True while a container holds the copy (its ref lock), or an overlay of ours lists it."""
    try:
        fd = os.open(cache / f"{key}.ref", os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    # a watcher killed with SIGKILL drops its lock, but the overlay may still be up
    needle = str(cache / key)
    with open("/proc/self/mountinfo") as mountinfo:
        return any(needle in line for line in mountinfo)


def evict(cache: Path, key: str) -> None:
    """Remove the copy ``key`` from the cache: its tree, then its ref file."""
    shutil.rmtree(cache / key, ignore_errors=True)
    (cache / f"{key}.ref").unlink(missing_ok=True)


def sweep_report(settings: ReadPathSettings, release_job: bool = False) -> dict:
    """``sweep_cache``, then the copies that remain (``infohpc``'s JSON)."""
    removed = sweep_cache(settings, release_job)
    cache = Path(settings.unpack_dir)
    remaining = copies(cache) if settings.unpack_dir and cache.is_dir() else []
    return {"removed": removed, "copies": [copy.__dict__ for copy in remaining]}


if __name__ == "__main__":  # podman-hpc infohpc runs this inside podman's user namespace
    import sys

    if sys.argv[1:2] != ["sweep"]:
        sys.exit("usage: python -m jupyter_podman_hpc.engine.mount.cache sweep [--release-job]")
    print(json.dumps(sweep_report(ReadPathSettings.from_env(), release_job=sys.argv[2:] == ["--release-job"])))
    sys.exit(0)
