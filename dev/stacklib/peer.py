"""podman-hpc 1.2.2, the upstream tool, installed side by side with ours.

Integration tests and benchmarks run it as a peer (same podman_hpc.yaml keys,
same squashed-store layout). Three parts, each checked and rebuilt on its own:

- a statically linked mksquashfs 4.6.1: podman-hpc's migrate bind-mounts it
  into the image it squashes and passes -xattrs-exclude, which needs
  squashfs-tools >= 4.6 (bookworm has 4.5.1). It is built from Debian
  trixie's source package with a throwaway apt configuration (the host's
  sources and lists are not touched) and cached outside the checkout.
- a virtual environment from Debian's python3 with podman-hpc==1.2.2.
- its podman_hpc.yaml (the one the wheel ships, paths fixed for this host:
  the venv's fuse-overlayfs-wrap and modules.d, a generated hooks.d, the
  static mksquashfs) next to that hooks.d.

Using it: `PODMANHPC_CONFIG_FILE=$STACK_PEER_CONFIG $STACK_PEER_BIN ...` with
PATH holding `$STACK_PEER_VENV/bin`, /usr/bin and /usr/sbin: podman-hpc 1.2.2
refuses to start unless `fuse-overlayfs-wrap`, `podman` and `crun` or `runc`
are on PATH, whatever its configuration says (Debian puts runc in /usr/sbin),
and fuse-overlayfs-wrap calls `inotifywait` and `umount` from PATH. Its
storage defaults to /tmp/<uid>_hpc/{storage,config} (the shipped templates);
PODMANHPC_GRAPH_ROOT, PODMANHPC_RUN_ROOT and PODMANHPC_CONFIG_HOME move it.
The squashed store is `--squash-dir DIR` or $SQUASH_DIR (default
$SCRATCH/storage); its parent must exist.
"""

import json
import os
import shutil
import time
from pathlib import Path

from . import layout
from .image import apt_mirror
from .proc import run, say

REQUIREMENT = f"podman-hpc=={layout.PEER_VERSION}"
VENV_STAMP = layout.PEER_VENV / ".jph-stamp"
PYTHON = layout.PEER_VENV / "bin" / "python"
HOOK_TOOL = layout.PEER_VENV / "bin" / "hook_tool"
HOOK_FILE = "02-hook_tool.json"  # the name podman_hpc.configure_hooks writes
MKSQUASHFS_BUILD = layout.CACHE / "mksquashfs.build"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def up() -> None:
    build_mksquashfs()
    venv_up()
    config_up()


def status() -> dict[str, bool]:
    ok = mksquashfs_ready(layout.MKSQUASHFS_STATIC) and venv_ready() and config_ready()
    return {f"podman-hpc {layout.PEER_VERSION} peer": ok}


# --- a static mksquashfs ----------------------------------------------------


def mksquashfs_ready(path: Path) -> bool:
    """``path`` is a statically linked mksquashfs of the wanted version."""
    if not (path.is_file() and os.access(path, os.X_OK)):
        return False
    if run(["ldd", str(path)], check=False, quiet=True).returncode == 0:
        return False  # ldd succeeds only on dynamic executables
    version = run([str(path), "-version"], check=False, quiet=True)
    return version.returncode == 0 and version.stdout.startswith(f"mksquashfs version {layout.MKSQUASHFS_VERSION} ")


def build_mksquashfs() -> None:
    target = layout.MKSQUASHFS_STATIC
    if mksquashfs_ready(target):
        return
    say(
        f"building a static mksquashfs {layout.MKSQUASHFS_VERSION} from Debian trixie's source "
        f"package; cached as {target}"
    )
    started = time.monotonic()
    build = MKSQUASHFS_BUILD
    shutil.rmtree(build, ignore_errors=True)  # whatever a killed attempt left
    apt_dir = build / "apt"
    for sub in ("sources.list.d", "lists/partial", "cache/archives/partial"):
        (apt_dir / sub).mkdir(parents=True)
    mirror, _ = apt_mirror()
    (apt_dir / "sources.list.d" / "trixie-src.sources").write_text(
        f"Types: deb-src\nURIs: {mirror}\nSuites: trixie\nComponents: main\nSigned-By: {KEYRING}\n"
    )
    # Only these options point apt elsewhere; the host's sources, lists and
    # caches stay as they are (its proxy and other settings still apply).
    apt = [
        "apt-get",
        "-o",
        "Dir::Etc::SourceList=/dev/null",
        "-o",
        f"Dir::Etc::SourceParts={apt_dir / 'sources.list.d'}",
        "-o",
        f"Dir::State::Lists={apt_dir / 'lists'}",
        "-o",
        f"Dir::Cache={apt_dir / 'cache'}",
        "-o",
        "APT::Sandbox::User=root",
    ]
    run([*apt, "update"])
    download = build / "download"
    download.mkdir()
    run([*apt, "source", "--download-only", "squashfs-tools/trixie"], cwd=download)
    dsc = next(download.glob("squashfs-tools_*.dsc"))
    upstream = dsc.stem.split("_", 1)[1].rsplit("-", 1)[0]
    if upstream != layout.MKSQUASHFS_VERSION:
        raise SystemExit(
            f"[stack] trixie's squashfs-tools is {upstream}, not {layout.MKSQUASHFS_VERSION}: "
            "update MKSQUASHFS_VERSION in dev/stacklib/layout.py"
        )
    tree = build / "squashfs-tools"
    run(["dpkg-source", "-x", str(dsc), str(tree)], cwd=build)
    sources = tree / "squashfs-tools"
    run(
        [
            "make",
            f"-j{os.cpu_count() or 1}",
            "LZ4_SUPPORT=1",
            "XZ_SUPPORT=0",
            "LZO_SUPPORT=0",
            "ZSTD_SUPPORT=0",
            "EXTRA_LDFLAGS=-static",
            "mksquashfs",
        ],
        cwd=sources,
    )
    built = sources / "mksquashfs"
    if not mksquashfs_ready(built):
        raise SystemExit(f"[stack] {built} is not a static mksquashfs {layout.MKSQUASHFS_VERSION}")
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(built, partial)
    partial.chmod(0o755)
    os.replace(partial, target)
    shutil.rmtree(build)
    say(f"built {target.name} in {time.monotonic() - started:.1f} s")


# --- the virtual environment -------------------------------------------------


def venv_ready() -> bool:
    return VENV_STAMP.exists() and VENV_STAMP.read_text() == REQUIREMENT + "\n" and layout.PEER_BIN.exists()


def venv_up() -> None:
    if venv_ready():
        return
    say(f"creating the peer's virtual environment {layout.PEER_VENV} ({REQUIREMENT})")
    started = time.monotonic()
    # Rebuilt from scratch, in place: a venv's scripts and the hook JSON name
    # its final path, so it cannot be built elsewhere and renamed. The stamp,
    # written last, is what marks it complete.
    shutil.rmtree(layout.PEER_VENV, ignore_errors=True)
    run(["/usr/bin/python3", "-m", "venv", str(layout.PEER_VENV)])
    run([str(PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", REQUIREMENT])
    run(["chmod", "-R", "a+rX", str(layout.PEER_VENV)])
    if shipped_config_dir() is None:
        raise SystemExit(f"[stack] {REQUIREMENT} installed no etc/podman_hpc/podman_hpc.yaml")
    VENV_STAMP.write_text(REQUIREMENT + "\n")
    say(f"installed {REQUIREMENT} in {time.monotonic() - started:.1f} s")


def shipped_config_dir() -> Path | None:
    """The wheel's etc/podman_hpc: its data files land under the venv's prefix."""
    records = (layout.PEER_VENV / "lib").glob("python3*/site-packages/podman_hpc-*.dist-info/RECORD")
    for record in records:
        for line in record.read_text().splitlines():
            name = line.split(",", 1)[0]
            if name.endswith("etc/podman_hpc/podman_hpc.yaml"):
                # RECORD paths are relative to site-packages.
                return Path(os.path.normpath(record.parent.parent / name)).parent
    return None


# --- its configuration ---------------------------------------------------------


def _settings(data: Path) -> dict[str, str]:
    return {
        "podman_bin": "/usr/bin/podman",
        "mount_program": str(layout.PEER_VENV / "bin" / "fuse-overlayfs-wrap"),
        "modules_dir": str(data / "modules.d"),
        "hooks_dir": str(layout.PEER_HOOKS_DIR),
        "mksquashfs_bin": str(layout.MKSQUASHFS_STATIC),
    }


def wanted_config() -> str | None:
    """The shipped podman_hpc.yaml with our paths (keys it lacks are appended)."""
    data = shipped_config_dir()
    if data is None:
        return None
    settings = _settings(data)
    lines = [
        f"# Written by jupyter-podman-hpc's dev/stack: podman-hpc {layout.PEER_VERSION}'s shipped podman_hpc.yaml,",
        "# paths fixed for this host. Use it with PODMANHPC_CONFIG_FILE.",
    ]
    for line in (data / "podman_hpc.yaml").read_text().splitlines():
        key = line.split(":", 1)[0].strip()
        if key in settings:
            line = f"{key}: {json.dumps(settings.pop(key))}"  # a JSON string is a YAML string
        lines.append(line)
    lines += [f"{key}: {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _hooks_ready(hooks_dir: Path) -> bool:
    try:
        hook = json.loads((hooks_dir / HOOK_FILE).read_text())
    except (OSError, ValueError):
        return False
    return hook.get("hook", {}).get("path") == str(HOOK_TOOL)


def config_ready() -> bool:
    wanted = wanted_config()
    return (
        wanted is not None
        and layout.PEER_CONFIG.exists()
        and layout.PEER_CONFIG.read_text() == wanted
        and _hooks_ready(layout.PEER_HOOKS_DIR)
    )


def config_up() -> None:
    if config_ready():
        return
    say(f"writing the peer's configuration {layout.PEER_CONFIG}")
    text = wanted_config()
    build = layout.PEER_DIR.with_name(f"{layout.PEER_DIR.name}.build")
    old = layout.PEER_DIR.with_name(f"{layout.PEER_DIR.name}.old")
    shutil.rmtree(build, ignore_errors=True)
    build.mkdir(parents=True)
    config = build / layout.PEER_CONFIG.name
    config.write_text(text)
    hooks = build / layout.PEER_HOOKS_DIR.name
    # The hook JSON names the venv's hook_tool; only the venv's python writes it right.
    run([str(PYTHON), "-m", "podman_hpc.configure_hooks", "--hooksd", str(hooks)])
    if not _hooks_ready(hooks):
        raise SystemExit(f"[stack] podman_hpc.configure_hooks did not write {HOOK_FILE} as expected")
    # Read it back with the YAML loader podman-hpc itself uses.
    loaded = json.loads(
        run(
            [
                str(PYTHON),
                "-c",
                "import json, sys, yaml; print(json.dumps(yaml.load(open(sys.argv[1]), Loader=yaml.FullLoader)))",
                str(config),
            ]
        ).stdout
    )
    wanted = _settings(shipped_config_dir())
    if {key: loaded.get(key) for key in wanted} != wanted:
        raise SystemExit(f"[stack] {config} does not read back as written")
    run(["chmod", "-R", "a+rX", str(build)])
    # Swap the directory in; a crash between the renames leaves no PEER_DIR,
    # and the next `up` writes it again.
    shutil.rmtree(old, ignore_errors=True)
    if layout.PEER_DIR.exists():
        os.replace(layout.PEER_DIR, old)
    os.replace(build, layout.PEER_DIR)
    shutil.rmtree(old, ignore_errors=True)
