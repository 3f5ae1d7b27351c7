"""The base image: Debian minbase with python3, ipykernel, Open MPI, mpi4py and ipyparallel.

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
    # The wheels are fetched on the host (its pip is configured for the package index) with
    # the pip wheel Debian ships, and installed in the chroot with that same wheel.
    pip_wheel = _pip_wheel()
    wheels = root / "tmp" / "wheels"
    wheels.mkdir()
    shutil.copy(pip_wheel, wheels / pip_wheel.name)
    run(
        [
            "/usr/bin/python3",
            str(pip_wheel / "pip"),
            "download",
            "--no-deps",
            "--quiet",
            "--dest",
            str(wheels),
            *layout.BASE_WHEELS,
        ]
    )
    pip = f"/tmp/wheels/{pip_wheel.name}/pip"
    # A private mount namespace: /proc and /dev vanish with it, even after a kill.
    run(
        [
            "unshare",
            "--mount",
            "--fork",
            "sh",
            "-c",
            f"""
        set -e
        mount -t proc proc "$1/proc"
        mount --rbind /dev "$1/dev"
        chroot "$1" apt-get -o Acquire::Check-Valid-Until=false update
        DEBIAN_FRONTEND=noninteractive chroot "$1" apt-get install -y --no-install-recommends {packages}
        chroot "$1" apt-get clean
        chroot "$1" sh -c 'python3 {pip} install --no-index --no-deps --ignore-installed \
            --break-system-packages --root-user-action=ignore --disable-pip-version-check --quiet \
            $(ls /tmp/wheels/*.whl | grep -v /pip-)'
    """,
            "sh",
            str(root),
        ]
    )
    shutil.rmtree(wheels)
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "etc/resolv.conf").unlink(missing_ok=True)
    partial = layout.BASE_ROOTFS.with_suffix(".partial")
    run(["tar", "--numeric-owner", "-C", str(root), "-cf", str(partial), "."])
    partial.replace(layout.BASE_ROOTFS)
    shutil.rmtree(root)
    for stale in layout.CACHE.glob("base-rootfs-*.tar"):
        if stale != layout.BASE_ROOTFS:
            stale.unlink()  # a root filesystem of an older package list


def _pip_wheel() -> Path:
    """Debian's pip wheel (python3-pip-whl, which python3-venv brings)."""
    found = sorted(Path("/usr/share/python-wheels").glob("pip-*.whl"))
    if not found:
        raise SystemExit("[stack] no pip wheel in /usr/share/python-wheels: install python3-pip-whl")
    return found[-1]


def _in_registry(reference: str) -> bool:
    repo, tag = reference.split("/", 1)[1].rsplit(":", 1)
    return answers(f"/v2/{repo}/manifests/{tag}", method="HEAD")


def _pushed_key(name: str) -> Path:
    return layout.STATE / f"{name}.pushed"


def pushed(name: str, reference: str, key: str) -> bool:
    marker = _pushed_key(name)
    return marker.exists() and marker.read_text().strip() == key and _in_registry(reference)


def import_and_push(name: str, rootfs: Path, reference: str, key: str) -> None:
    """Import a root filesystem tarball as the stack user and push it to the registry."""
    say(f"importing and pushing {reference}")
    rootfs.chmod(0o644)
    layout.CACHE.chmod(0o755)
    # A throwaway storage, so the user's own podman storage stays untouched.
    storage = Path(tempfile.mkdtemp(prefix="jph-import-"))
    shutil.chown(storage, layout.USER)
    podman = ["podman", "--root", f"{storage}/root", "--runroot", f"{storage}/run"]
    env = user_env()
    try:
        run(as_user(layout.USER, [*podman, "import", "--change", "CMD=/bin/sh", str(rootfs), reference], env), cwd="/")
        run(as_user(layout.USER, [*podman, "push", reference], env), cwd="/")
    finally:
        run(as_user(layout.USER, ["podman", "unshare", "rm", "-rf", str(storage)], env), check=False, cwd="/")
        shutil.rmtree(storage, ignore_errors=True)
    _pushed_key(name).write_text(key + "\n")


def build_tiny_rootfs() -> None:
    """A few-MB image (busybox) for tests of store mechanics, where size only costs time."""
    if layout.TINY_ROOTFS.exists():
        return
    root = layout.CACHE / "tiny.build"
    shutil.rmtree(root, ignore_errors=True)
    for directory in ("bin", "etc", "tmp", "proc", "sys", "dev", "root"):
        (root / directory).mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for applet in (
        "sh",
        "cat",
        "echo",
        "ls",
        "sleep",
        "true",
        "false",
        "test",
        "rm",
        "mkdir",
        "touch",
        "id",
        "env",
        "head",
        "stat",
        "readlink",
        "grep",
        "wc",
        "uname",
        "hostname",
    ):
        (root / "bin" / applet).symlink_to("busybox")
    (root / "etc" / "os-release").write_text('NAME="jph tiny"\nID=tiny\nVERSION_CODENAME=tiny\n')
    (root / "tmp").chmod(0o1777)
    partial = layout.TINY_ROOTFS.with_suffix(".partial")
    run(["tar", "--numeric-owner", "--owner=0", "--group=0", "-C", str(root), "-cf", str(partial), "."])
    partial.replace(layout.TINY_ROOTFS)
    shutil.rmtree(root)


def up() -> None:
    if not pushed("base-image", layout.BASE_IMAGE, layout.BASE_ROOTFS_KEY):
        build_rootfs()
        import_and_push("base-image", layout.BASE_ROOTFS, layout.BASE_IMAGE, layout.BASE_ROOTFS_KEY)
    if not pushed("tiny-image", layout.TINY_IMAGE, layout.TINY_ROOTFS_KEY):
        build_tiny_rootfs()
        import_and_push("tiny-image", layout.TINY_ROOTFS, layout.TINY_IMAGE, layout.TINY_ROOTFS_KEY)


def status() -> dict[str, bool]:
    return {
        "base image": pushed("base-image", layout.BASE_IMAGE, layout.BASE_ROOTFS_KEY),
        "tiny image": pushed("tiny-image", layout.TINY_IMAGE, layout.TINY_ROOTFS_KEY),
    }
