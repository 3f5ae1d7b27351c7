"""The ``podman-hpc infohpc`` report (also ``%podman_hpc info``), as lines: the effective
configuration and where each value comes from, the image stores, the read path of squashed
images with the user's unpacked copies on this node, and the site's modules."""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ..version import __version__


def report(site) -> Iterator[str]:
    """The whole report of a ``run.plan.Site``, line by line (sweeping the unpack cache on the way)."""
    from .store.access import configured_stores, store_access

    c = site.config
    yield f"podman-hpc version: {__version__} (jupyter-podman-hpc)"
    yield f"config file: {c.config_file or 'none'}"
    for key in c.keys():  # noqa: SIM118  a SiteConfig is no dict: keys() lists the settings a file may set
        value = getattr(c, key)
        source = c.sources.get(key, "default")
        if isinstance(value, list):
            yield f"{key} ({source}): (list)"
            yield from (f" - {item}" for item in value)
        else:
            yield f"{key} ({source}): {value}"
    yield "image stores (a name is taken from the first that has it):"
    yield f" 1. node-local: {c.graph_root}"
    for number, directory in enumerate(configured_stores(c), start=2):
        kind = "squashed, personal" if directory == c.squash_dir else "squashed, additional"
        yield f" {number}. {kind}: {directory} ({store_access(directory)})"
    yield from read_path(site)
    yield f"modules ({c.modules_dir}):"
    for module in site.modules:
        flag = module.flag if module.cli_arg else "(no flag)"
        extra = f" conflicts: {', '.join(module.conflicts)}" if module.conflicts else ""
        yield f" - {module.name}: {flag}  {module.help}{extra}"


def read_path(site) -> Iterator[str]:
    """The read path this node gives squashed images, its unpack policy and the user's
    unpacked copies here (swept first), and why it fell back where it did."""
    from .site.readpath import fallbacks

    c, podman = site.config, site.podman
    settings = c.read_path
    yield f"read path of squashed images: {c.squash_read_path}"
    cache = Path(c.squash_unpack_dir)
    where = f"in Slurm job {c.slurm_job_id}" if c.slurm_job_id else "a login node (no SLURM_JOB_ID)"
    if settings.unpacks:
        free = shutil.disk_usage(cache if cache.is_dir() else cache.anchor).free
        key, value = c.budget_key
        yield (
            f" unpacks into {cache} ({where}): budget {settings.unpack_max_mb:g} MiB "
            f"({key} {value}), {free >> 20} MiB free; unused copies "
            f"removed after {c.squash_unpack_idle_minutes:g} min or when their job has ended"
        )
    elif c.squash_read_path == "auto" and settings.login_node:
        yield (
            f" no unpacking on {where}: kernel overlayfs over squashfuse (squash_read_path: unpacked to unpack here)"
        )
    yield from unpacked_copies(site)
    if settings.kernel_overlay:
        probe = podman.run(
            podman.command(
                "unshare", sys.executable, "-m", "jupyter_podman_hpc.engine.mount.kerneloverlay", c.run_root
            ),
            check=False,
        )
        verdict = "yes" if probe.returncode == 0 else f"no ({probe.stdout.strip() or probe.stderr.strip()})"
        yield f" kernel overlayfs in podman's user namespace: {verdict}"
    for line in fallbacks(Path(c.graph_root) / "squash-mounts"):
        yield f" fell back: {line}"


def unpacked_copies(site, release_job: bool = False) -> Iterator[str]:
    """Sweep the unpack cache (in podman's user namespace, where the trees' files can be removed
    and the overlays seen), then list what remains: size, last use, in use, job. ``release_job``:
    at a job's end on this node, also the copies this job made or used that no container holds."""
    cache = Path(site.config.squash_unpack_dir)
    if not cache.is_dir() or not any(cache.glob("*.ref")):
        yield f" unpacked copies: none in {cache}"
        return
    result = _sweep(site.podman, release_job)
    try:
        swept = json.loads(result.stdout)
    except ValueError:
        yield f" unpacked copies: cannot sweep {cache}: {(result.stderr or result.stdout).strip()}"
        return
    yield from _swept_lines(swept, cache)


def _sweep(podman, release_job: bool):
    """The cache's sweep, run in podman's user namespace (its report on stdout, JSON)."""
    return podman.run(
        podman.command(
            "unshare",
            sys.executable,
            "-m",
            "jupyter_podman_hpc.engine.mount.cache",
            "sweep",
            *(["--release-job"] if release_job else []),
        ),
        check=False,
    )


def _swept_lines(swept: dict, cache: Path) -> Iterator[str]:
    """A sweep's report: the copies it removed and why, then those that remain."""
    for key, why in swept["removed"]:
        yield f" removed unpacked copy {key}: {why}"
    held = swept["copies"]
    yield f" unpacked copies: {len(held)} in {cache}, {sum(c['bytes'] for c in held) >> 20} MiB of RAM"
    now = time.time()
    for copy in held:
        yield _copy_line(copy, now)


def _copy_line(copy: dict, now: float) -> str:
    """One unpacked copy: key, size, in use or not, last use, job and node, squash file."""
    state = "in use" if copy["in_use"] else "unused"
    job = f", job {copy['job']}" if copy["job"] else ""
    node = f" on {copy['node']}" if copy["node"] else ""
    return (
        f"  - {copy['key']} {copy['bytes'] >> 20} MiB, {state}, last used "
        f"{(now - copy['last_use']) / 60:.0f} min ago{job}{node}: {copy['squash'] or '?'}"
    )


__all__ = ["read_path", "report", "unpacked_copies"]
