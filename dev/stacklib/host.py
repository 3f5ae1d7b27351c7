"""Host preparation: Debian packages, podman's host settings, the stack user."""

import grp
import os
import pwd
import shutil
import stat
from pathlib import Path

from . import layout
from .proc import run, say, succeeds, write_if_changed

PACKAGES = [
    # containers
    "podman",
    "buildah",
    "skopeo",
    "runc",
    "conmon",
    "fuse-overlayfs",
    "squashfuse",
    "squashfs-tools",
    "uidmap",
    "catatonit",
    "containernetworking-plugins",
    # Slurm and its accounting database
    "slurm-wlm",
    "slurmctld",
    "slurmd",
    "slurmdbd",
    "slurm-client",
    "munge",
    "mariadb-server",
    # MPI
    "openmpi-bin",
    "libopenmpi-dev",
    "libpmix-dev",
    "python3-mpi4py",
    # registry, base image, browser tests, build tools
    "docker-registry",
    "debootstrap",
    "busybox-static",
    "chromium",
    "python3-venv",
    "python3-pip-whl",
    "python3-dev",
    "gcc",
    "libc6-dev",
    "iproute2",
    "procps",
    "psmisc",
    "curl",
    # tests act as the project's second member and as an outsider through sudo
    "sudo",
    # tests/faults: a small ext4 store the stack user mounts itself, so that a migrate fills it (ENOSPC)
    "fuse2fs",
    # the podman-hpc 1.2.2 peer: its fuse-overlayfs-wrap waits with inotifywait;
    # a static mksquashfs is built from a Debian source package
    "inotify-tools",
    "make",
    "dpkg-dev",
    "xz-utils",
    "liblz4-dev",
    "zlib1g-dev",
    # bare-metal LAMMPS for the EXAALT-like benchmark
    "lammps",
    # bare-metal PyTorch for the DeepCAM-like benchmark (about 150 MB to fetch, 640 MB installed)
    "python3-torch",
    "python3-numpy",
]

# podman reads drop-ins from here; our file only says what this host needs.
CONTAINERS_DROPIN = Path("/etc/containers/containers.conf.d/50-jph-stack.conf")
REGISTRIES_DROPIN = Path("/etc/containers/registries.conf.d/50-jph-stack.conf")
STORAGE_CONF = Path("/etc/containers/storage.conf")


def missing_packages() -> list[str]:
    result = run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n"], check=False)
    installed = {line.split()[0] for line in result.stdout.splitlines() if line.endswith(" installed")}
    return [p for p in PACKAGES if p not in installed]


def install_packages() -> None:
    missing = missing_packages()
    if not missing:
        return
    say(f"installing Debian packages: {' '.join(missing)}")
    policy = Path("/usr/sbin/policy-rc.d")
    had_policy = policy.exists()
    if not had_policy:
        # Keep the packages' own services (registry on every interface,
        # a system mariadb, ...) from starting: the stack starts its own.
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    try:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update"], env=env)
        run(["apt-get", "install", "-y", "--no-install-recommends", *missing], env=env)
    finally:
        if not had_policy:
            policy.unlink(missing_ok=True)


def configure_podman() -> None:
    settings = {"containers": [], "engine": []}
    if not Path("/sys/fs/cgroup/cgroup.controllers").exists():
        # cgroups v1/hybrid: crun refuses to run, systemd is not managing cgroups.
        settings["engine"] += ['runtime = "runc"', 'cgroup_manager = "cgroupfs"', 'events_logger = "file"']
    tun = Path("/dev/net/tun")
    if not tun.exists() or not tun.stat().st_mode & stat.S_IROTH:
        # Rootless slirp4netns needs /dev/net/tun; HPC sites use the host network anyway.
        settings["containers"].append('netns = "host"')
    text = "# Written by jupyter-podman-hpc's dev/stack for this host.\n"
    for section, lines in settings.items():
        if lines:
            text += f"[{section}]\n" + "".join(f"{line}\n" for line in lines)
    write_if_changed(CONTAINERS_DROPIN, text)
    write_if_changed(
        REGISTRIES_DROPIN,
        (
            "# The stack's local registry speaks plain HTTP on loopback.\n"
            f'[[registry]]\nlocation = "{layout.REGISTRY}"\ninsecure = true\n'
        ),
    )
    if not STORAGE_CONF.exists():
        # Without it rootless podman may pick vfs, which refuses a mount_program.
        write_if_changed(STORAGE_CONF, '[storage]\ndriver = "overlay"\n')
    fuse = Path("/dev/fuse")
    if fuse.exists() and (fuse.stat().st_mode & 0o666) != 0o666:
        fuse.chmod(0o666)  # rootless fuse-overlayfs and squashfuse need it
    if not _root_is_shared():
        # As on a systemd host; rootless podman warns on every call otherwise.
        run(["mount", "--make-rshared", "/"])
    mqueue = Path("/dev/mqueue")
    if not os.path.ismount(mqueue):
        # --ipc=host (used by MPI modules) statfs()es /dev/mqueue.
        mqueue.mkdir(exist_ok=True)
        run(["mount", "-t", "mqueue", "mqueue", str(mqueue)])


def _root_is_shared() -> bool:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        if fields[4] == "/":
            return any(f.startswith("shared:") for f in fields[6 : fields.index("-")])
    return False


def podman_configured() -> bool:
    fuse_ok = (Path("/dev/fuse").stat().st_mode & 0o666) == 0o666
    return (
        CONTAINERS_DROPIN.exists()
        and REGISTRIES_DROPIN.exists()
        and fuse_ok
        and os.path.ismount("/dev/mqueue")
        and _root_is_shared()
    )


def _free_subid_start(path: Path) -> int:
    start = 200000
    for line in path.read_text().splitlines() if path.exists() else []:
        parts = line.split(":")
        if len(parts) == 3:
            start = max(start, int(parts[1]) + int(parts[2]))
    return start


def _has_subids(user: str, path: Path) -> bool:
    return path.exists() and any(line.startswith(f"{user}:") for line in path.read_text().splitlines())


def _create_rootless_user(user: str) -> None:
    """A login user with its own home and subordinate id ranges (rootless podman needs them)."""
    try:
        pwd.getpwnam(user)
    except KeyError:
        say(f"creating user {user}")
        run(["useradd", "--create-home", "--shell", "/bin/bash", user])
    for kind, path in (("subuids", Path("/etc/subuid")), ("subgids", Path("/etc/subgid"))):
        if not _has_subids(user, path):
            start = _free_subid_start(path)
            run(["usermod", f"--add-{kind}", f"{start}-{start + 65535}", user])


def _in_group(user: str, group: str) -> bool:
    try:
        return user in grp.getgrnam(group).gr_mem
    except KeyError:
        return False


def _sudoers() -> str:
    others = ",".join((layout.USER2, layout.OUTSIDER))
    text = (
        "# Written by jupyter-podman-hpc's dev/stack: the stack user's tests act as the\n"
        "# project's second member and as an outsider: it can become them.\n"
        f"{layout.USER} ALL=({others}) NOPASSWD: ALL\n"
    )
    stack = _root_only_stack()
    if stack:
        commands = ", ".join(
            f"{stack} {command} {node}" for command in ("node-kill", "node-boot") for node in layout.NODES
        )
        text += (
            "# As root it may run exactly these: a Slurm node's power loss and its boot\n"
            "# (tests/faults/test_node_death.py).\n"
            f"{layout.USER} ALL=(root) NOPASSWD: {commands}\n"
        )
    return text


def _root_only_stack() -> str:
    """dev/stack's path, if only root can change what it runs (the script, dev/stacklib and
    every directory above them); else "" and the stack user gets no rule to run it as root.
    A sticky directory others write in (a clone in /tmp) is fine: they cannot replace root's
    entries there."""
    script = layout.CHECKOUT / "dev" / "stack"
    library = layout.CHECKOUT / "dev" / "stacklib"
    for path in (script, library, *library.iterdir(), *library.parents):
        info = path.lstat()
        others_write = info.st_mode & 0o022 and not (stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX)
        if info.st_uid != 0 or others_write or stat.S_ISLNK(info.st_mode):
            say(f"no sudo rule for the node commands: {path} is not root's alone")
            return ""
    # sudoers would need these escaped in a command's path: keep to plain paths
    if not all(ch.isascii() and (ch.isalnum() or ch in "/._-+") for ch in str(script)):
        say(f"no sudo rule for the node commands: {script} has characters sudoers would misread")
        return ""
    return str(script)


def create_user() -> None:
    """The stack user, a second member of the project group, and a user outside it."""
    for user in (layout.USER, layout.USER2, layout.OUTSIDER):
        _create_rootless_user(user)
    try:
        grp.getgrnam(layout.PROJECT_GROUP)
    except KeyError:
        run(["groupadd", layout.PROJECT_GROUP])
    for user in (layout.USER, layout.USER2):
        if not _in_group(user, layout.PROJECT_GROUP):
            run(["usermod", "--append", "--groups", layout.PROJECT_GROUP, user])
    if _in_group(layout.OUTSIDER, layout.PROJECT_GROUP):  # left over from a mistake: never a member
        run(["gpasswd", "--delete", layout.OUTSIDER, layout.PROJECT_GROUP])
    text = _sudoers()
    if not (layout.SUDOERS.exists() and layout.SUDOERS.read_text() == text):
        staged = layout.SUDOERS.with_name(".jph-stack.tmp")  # sudo ignores names with a dot
        staged.write_text(text)
        staged.chmod(0o440)
        run(["visudo", "-c", "-q", "-f", str(staged)])
        os.replace(staged, layout.SUDOERS)


def user_ready() -> bool:
    users = (layout.USER, layout.USER2, layout.OUTSIDER)
    try:
        for user in users:
            pwd.getpwnam(user)
    except KeyError:
        return False
    return (
        all(_has_subids(user, Path("/etc/subuid")) and _has_subids(user, Path("/etc/subgid")) for user in users)
        and _in_group(layout.USER, layout.PROJECT_GROUP)
        and _in_group(layout.USER2, layout.PROJECT_GROUP)
        and not _in_group(layout.OUTSIDER, layout.PROJECT_GROUP)
        and _sudoers_ready()
    )


def _sudoers_ready() -> bool:
    """The sudo rule is in place (only root may read it: others see that it exists)."""
    try:
        return layout.SUDOERS.read_text() == _sudoers()
    except PermissionError:
        return layout.SUDOERS.exists()
    except FileNotFoundError:
        return False


def user_env() -> dict[str, str]:
    """The environment a login of the stack user would have.

    No XDG_RUNTIME_DIR, and no /run/user/<uid>: rootless podman then keeps
    its runtime files (and its pause process, whose mount namespace every
    podman call joins) under /tmp, which is private to each Slurm node, as
    its runtime directory is on a real compute node.
    """
    return {
        "HOME": str(layout.USER_HOME),
        "USER": layout.USER,
        "LOGNAME": layout.USER,
        "PATH": f"{layout.VENV}/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
        "SLURM_CONF": str(layout.SLURM_CONF),
        "LANG": "C.UTF-8",
    }


def build_bind_shim() -> None:
    source = layout.CHECKOUT / "dev" / "bind_loopback.c"
    target = layout.BIND_SHIM
    if target.exists() and target.stat().st_mtime >= source.stat().st_mtime:
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    run(["gcc", "-shared", "-fPIC", "-O2", "-o", str(tmp), str(source), "-ldl"])
    os.replace(tmp, target)


def make_checkout_readable() -> None:
    """The stack user runs tests and the editable install from the checkout."""
    if succeeds(["runuser", "-u", layout.USER, "--", "test", "-r", str(layout.CHECKOUT / "pyproject.toml")]):
        return
    for parent in [layout.CHECKOUT, *layout.CHECKOUT.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            say(f"making {parent} traversable for {layout.USER}")
            parent.chmod(mode | stat.S_IXOTH)
    if not succeeds(["runuser", "-u", layout.USER, "--", "test", "-r", str(layout.CHECKOUT / "pyproject.toml")]):
        raise SystemExit(f"[stack] {layout.USER} cannot read {layout.CHECKOUT}: clone it somewhere world-readable")


def scratch() -> None:
    """The shared file system all nodes and the login side see, and the project's directory on it."""
    entry = pwd.getpwnam(layout.USER)
    layout.SCRATCH.mkdir(parents=True, exist_ok=True)
    layout.SCRATCH.chmod(0o1777)
    for user in (layout.USER, layout.USER2, layout.OUTSIDER):
        owner = pwd.getpwnam(user)
        user_dir = layout.SCRATCH / user
        user_dir.mkdir(exist_ok=True)
        os.chown(user_dir, owner.pw_uid, owner.pw_gid)
    # As a project directory at a centre: root's, the project group's, setgid,
    # and closed to everyone else; members make their stores in it.
    layout.PROJECT_DIR.mkdir(parents=True, exist_ok=True)
    os.chown(layout.PROJECT_DIR, 0, grp.getgrnam(layout.PROJECT_GROUP).gr_gid)
    layout.PROJECT_DIR.chmod(0o2770)
    # Screenshots and logs the tests leave for people to look at, benchmark results (make bench),
    # the docs site (make docs) and the checks' caches (make lint).
    for output in (
        layout.CHECKOUT / "tests" / "artifacts",
        layout.CHECKOUT / "bench" / "results",
        layout.CHECKOUT / "docs" / "build",
        layout.CHECKOUT / ".ruff_cache",
        layout.CHECKOUT / ".mypy_cache",
    ):
        output.mkdir(exist_ok=True)
        os.chown(output, entry.pw_uid, entry.pw_gid)


def which(program: str) -> str:
    path = shutil.which(program, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if path is None:
        raise SystemExit(f"[stack] {program} is not installed")
    return path
