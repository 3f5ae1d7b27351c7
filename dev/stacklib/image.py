"""The base image: Debian minbase with python3, ipykernel, Open MPI and mpi4py.

The root filesystem is built once with debootstrap from the machine's own
apt mirror and cached as a tarball outside the checkout; it is imported as
the stack user and pushed to the local registry.
"""

import re
import shutil
import tempfile
from pathlib import Path

from . import layout
from .host import user_env
from .proc import as_user, run, say
from .registry import answers

PUSHED_KEY = layout.STATE / "base-image.pushed"


def apt_mirror() -> tuple[str, str]:
    """The Debian mirror and suite apt already uses on this machine."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for stanza in sources.read_text().split("\n\n"):
            uris = re.search(r"^URIs:\s*(\S+)", stanza, re.M)
            suites = re.search(r"^Suites:\s*(\S+)", stanza, re.M)
            if uris and suites and "security" not in suites.group(1):
                return uris.group(1), suites.group(1)
    legacy = Path("/etc/apt/sources.list")
    if legacy.exists():
        for line in legacy.read_text().splitlines():
            m = re.match(r"deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)\s+main", line)
            if m and "security" not in m.group(2):
                return m.group(1), m.group(2)
    raise SystemExit("[stack] no Debian mirror found in /etc/apt: cannot build the base image")


def build_rootfs() -> None:
    if layout.BASE_ROOTFS.exists():
        return
    mirror, suite = apt_mirror()
    layout.CACHE.mkdir(parents=True, exist_ok=True)
    root = layout.CACHE / "rootfs.build"
    shutil.rmtree(root, ignore_errors=True)
    say(f"building the base root filesystem with debootstrap ({suite}); cached afterwards")
    run(["debootstrap", "--variant=minbase", "--include=python3", suite, str(root), mirror])
    shutil.copy("/etc/resolv.conf", root / "etc/resolv.conf")
    packages = " ".join(layout.BASE_PACKAGES)
    # A private mount namespace: /proc and /dev vanish with it, even after a kill.
    run(["unshare", "--mount", "--fork", "sh", "-c", f"""
        set -e
        mount -t proc proc "$1/proc"
        mount --rbind /dev "$1/dev"
        chroot "$1" apt-get -o Acquire::Check-Valid-Until=false update
        DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get install -y --no-install-recommends {packages}
        chroot "$1" apt-get clean
    """, "sh", str(root)])
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    partial = layout.BASE_ROOTFS.with_suffix(".partial")
    run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."])
    partial.replace(layout.BASE_ROOTFS)
    shutil.rmtree(root)


def pushed() -> bool:
    repo, tag = layout.BASE_IMAGE.split("/", 1)[1].rsplit(":", 1)
    return PUSHED_KEY.exists() and PUSHED_KEY.read_text().strip() == layout.BASE_ROOTFS_KEY \
        and answers(f"/v2/{repo}/manifests/{tag}", method="HEAD")


def up() -> None:
    if pushed():
        return
    build_rootfs()
    say(f"importing and pushing {layout.BASE_IMAGE}")
    layout.BASE_ROOTFS.chmod(0o644)
    layout.CACHE.chmod(0o755)
    # A throwaway storage, so the user's own podman storage stays untouched.
    storage = Path(tempfile.mkdtemp(prefix="jph-import-"))
    shutil.chown(storage, layout.USER)
    podman = ["podman", "--root", f"{storage}/root", "--runroot", f"{storage}/run"]
    env = user_env()
    try:
        run(as_user(layout.USER, [*podman, "import", "--change", "CMD=/bin/bash",
                                  str(layout.BASE_ROOTFS), layout.BASE_IMAGE], env), cwd="/")
        run(as_user(layout.USER, [*podman, "push", layout.BASE_IMAGE], env), cwd="/")
    finally:
        run(as_user(layout.USER, ["podman", "unshare", "rm", "-rf", str(storage)], env), check=False, cwd="/")
        shutil.rmtree(storage, ignore_errors=True)
    PUSHED_KEY.write_text(layout.BASE_ROOTFS_KEY + "\n")


def status() -> dict[str, bool]:
    return {"base image": pushed()}
