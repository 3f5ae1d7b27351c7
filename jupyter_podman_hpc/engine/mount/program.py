"""podman-hpc-mount: the mount program podman runs for overlay mounts.

podman calls ``podman-hpc-mount -o lowerdir=A:B,upperdir=U,workdir=W MERGED``
(the ``mount_program`` storage option). A lower directory ``X`` with a
squashed image file ``X.squash`` beside it is replaced, as the read path
(``engine/site/readpath.py``) chooses, by an unpacked node-local copy of that
file or by a ``squashfuse_ll`` mount of it (``mount.squashfuse``), once the squash file
is checked against the digest its image record holds (``squashcheck``:
once per file identity on the node; a changed file is refused in one line
and the container does not start). Lowers that are exactly a local
image's layer chain are replaced by that image's squash file when the
user's own store has one and the read path unpacks it
(``squash_of_local_image``): once an image is squashed, its unpacked copy
is what containers read, whichever storage podman took it from. When every lower is
squashed the overlay is kernel overlayfs, else (or where the node refuses
it) fuse-overlayfs with the same arguments. A small watcher forked off stays
behind until the overlay is unmounted, then releases its lowers; the last
user of a squash mount on the node unmounts it, so containers from the same
image can start and stop in any order.

Environment knobs (as podman-hpc's fuse-overlayfs-wrap): FUSE_OVERLAYFS_BIN,
SQUASHFUSE_BIN, LOG (a file to append diagnostics to).
"""

from __future__ import annotations

import os
import select
import shutil
import stat
import sys
from pathlib import Path

from ..base import commands, processes
from ..base.private import own_dir
from ..errors import EngineError
from ..site.readpath import ReadPathSettings, note_fallback
from ..store.fs import Tree
from ..store.records import is_id, is_link, layer_of_link_target
from ..store.squashcheck import VerifiedFiles, check, recorded, verified_dir
from .cache import sweep_unused
from .kerneloverlay import kernel_options, mount_overlay
from .squashfuse import SquashMount, log, mounted_targets, mounts_dir
from .unpack import NoRoom, UnpackedCopy


def parse_args(argv: list[str]) -> tuple[list[str], str]:
    """(the -o option strings, the mount point) of a fuse-overlayfs command line."""
    options: list[str] = []
    positional: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "-o" and i + 1 < len(argv):
            options.append(argv[i + 1])
            i += 2
            continue
        if argv[i].startswith("-o") and len(argv[i]) > 2:
            options.append(argv[i][2:])
        elif not argv[i].startswith("-"):
            positional.append(argv[i])
        i += 1
    if not positional:
        raise SystemExit("podman-hpc-mount: no mount point given")
    return options, positional[-1]


def lower_dirs(options: list[str]) -> list[str]:
    """The lower directories a mount's ``-o`` options list, top first, as podman gave them."""
    for option in options:
        for item in option.split(","):
            if item.startswith("lowerdir="):
                return [d for d in item[len("lowerdir=") :].split(":") if d]
    return []


def _podman_stores() -> list[str]:
    """The additional image stores of the podman that runs us, from its command line."""
    try:
        argv = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []
    for arg in argv:
        if arg.startswith("additionalimagestore="):
            return [s for s in arg.split("=", 1)[1].split(",") if s]
    return []


def squash_of(lower: Path) -> tuple[Path, Path, set[str]] | None:
    """(squash file, directory to mount it on, the digests recorded for it) for a lower
    directory, or None.

    The squash file beside ``lower``, else the same layer's in another store:
    podman takes a layer's directory from the first store that has one, and an
    earlier store may hold only an empty skeleton of it (a failed migration
    of podman-hpc 1.2.2, or a parent layer of another image; upstream #172).
    A squash file counts only where its store has an image record of its
    layer (a file left without one is no image of anybody's), and only the
    store's records are read: a link (``<store>/overlay/l/<link>`` ->
    ``../<layer>/diff``) of any other form is not followed.
    """
    layer = _layer_of(lower)
    if not layer:
        return None
    squash = Path(f"{lower}.squash")
    if _is_file(squash):
        vouched, digests = recorded(lower.parent.parent.parent, layer)
        if vouched:
            return squash, lower, digests
    if _has_entries(lower.parent.parent / layer / "diff"):
        return None  # a real (unpacked) layer
    for store in _podman_stores():
        found = _squash_in(store, layer)
        if found:
            return found
    return None


def _squash_in(store: str, layer: str) -> tuple[Path, Path, set[str]] | None:
    """(squash file, its mount point, its recorded digests) of ``layer`` in ``store``, or None."""
    try:
        link = (Tree(store).read(("overlay", layer), "link") or b"").decode(errors="replace").strip()
    except (OSError, EngineError):
        return None
    candidate = Path(store) / "overlay" / "l" / link
    if is_link(link) and _is_file(Path(f"{candidate}.squash")):
        vouched, digests = recorded(store, layer)
        if vouched:
            return Path(f"{candidate}.squash"), candidate, digests
    return None


def squash_of_local_image(
    lowers: list[Path], graph_root: Path, stores: list[str]
) -> tuple[Path, Path, set[str]] | None:
    """The squash file that stands for a whole local image, or None.

    Once an image is squashed, its squashed copy is what containers read,
    whichever storage podman took it from: ``podman-hpc pull`` leaves the
    image in the node-local storage too, and podman prefers that copy, whose
    layers only fuse-overlayfs can stack (imports 1.4x slower than from an
    unpacked copy; the caller uses the squash file only as one). The local
    lowers are replaced when they are exactly one layer's chain in this
    graph root (the top layer, then the parents its ``lower`` file lists;
    nothing more, nothing less: a container of an image built on top of a
    squashed one keeps its own layers), and a store that only this user can
    write holds an image record of that top layer with its squash file. Layer
    ids are chain ids (of the content, or random for built layers, copied
    from the graph root that squashed them), so that file is the same tree
    flattened. A store others may write (a project store) is not used for
    this: its members could record any squash file under a layer id that
    anyone can compute for a public image.
    """
    if not lowers or lowers[0].parent.name != "l":
        return None
    overlay = lowers[0].parent.parent  # as podman spells it: the chain is compared in its spelling
    if os.path.realpath(overlay) != os.path.realpath(graph_root / "overlay"):
        return None  # the image's layers are in a store, not in this graph root
    layer = _layer_of(lowers[0])
    if not layer or lowers != _chain(overlay, layer, lowers[0]):
        return None
    for store in stores:
        if os.path.realpath(store) == os.path.realpath(graph_root):
            continue
        found = _squash_in(store, layer)
        if found and _only_ours(Path(store), layer, found[0]):
            return found
    return None


def _chain(overlay: Path, layer: str, top: Path) -> list[Path]:
    """The lower directories of ``layer``'s whole chain, top first, as containers/storage lists
    them (``<layer>/lower``: ``l/<link>:l/<link>...``, parents top first); [] if it is not readable."""
    try:
        text = (overlay / layer / "lower").read_text().strip()
    except FileNotFoundError:
        text = ""  # a base layer
    except OSError:
        return []
    parents = [entry for entry in text.split(":") if entry]
    if any(not (entry.startswith("l/") and is_link(entry[2:])) for entry in parents):
        return []
    return [top, *(overlay / entry for entry in parents)]


def _only_ours(store: Path, layer: str, squash: Path) -> bool:
    """Whether nobody but this user could have written the store's records and squash file of
    ``layer``: every directory on the way ours and not group- or other-writable, the files ours."""
    me = os.geteuid()  # in podman's user namespace the user's own files are root's
    directories = [
        store,
        store / "overlay-images",
        store / "overlay",
        store / "overlay" / "l",
        store / "overlay" / layer,
    ]
    files = [store / "overlay-images" / "images.json", store / "overlay" / layer / "link", squash]
    for path in directories + files:
        try:
            st = os.lstat(path)
        except OSError:
            return False
        kind = stat.S_ISDIR if path in directories else stat.S_ISREG
        if not kind(st.st_mode) or st.st_uid != me or st.st_mode & 0o022:
            return False
    return True


def _layer_of(lower: Path) -> str:
    """The layer a store's short link ``.../overlay/l/<link>`` stands for, or ''."""
    if lower.parent.name != "l" or not is_link(lower.name):
        return ""
    try:
        layer = layer_of_link_target(os.readlink(lower))
    except OSError:
        return ""
    return layer if is_id(layer) else ""


def _is_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _has_entries(directory: Path) -> bool:
    try:
        with os.scandir(directory) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def _with_lowers(argv: list[str], lowers: list[str]) -> list[str]:
    """``argv`` with its lowerdir option listing ``lowers``."""
    result = []
    for arg in argv:
        items = ["lowerdir=" + ":".join(lowers) if item.startswith("lowerdir=") else item for item in arg.split(",")]
        result.append(",".join(items))
    return result


def wait_for_unmount(target: str) -> None:
    """Block until ``target`` is no longer a mount point (mount table changes wake us)."""
    with open("/proc/self/mountinfo") as mountinfo:
        poller = select.poll()
        poller.register(mountinfo, select.POLLPRI | select.POLLERR)
        while target in mounted_targets():
            poller.poll()
            mountinfo.seek(0)
            mountinfo.read()


def _detach() -> bool:
    """Fork a watcher; True in the watcher, False in the parent (which then exits)."""
    if not processes.detach():
        return False
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    return True


def main(argv: list[str] | None = None) -> int:
    """Mount podman's overlay as the read path chooses; 0 once mounted (a watcher stays behind)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options, merged = parse_args(argv)
    merged = os.path.realpath(merged)
    # <graph root>/overlay/<layer>/merged: keep the reference counts beside the graph root.
    state_dir = own_dir(Path(merged).parents[2] / "squash-mounts")
    settings = ReadPathSettings.from_env()
    sweep_unused(settings)  # idle or ended jobs' copies go (an unpack sweeps in UnpackedCopy.acquire)
    held: list[SquashMount | UnpackedCopy] = []
    lowers: list[str] = []
    all_squashed = True
    verified = _Verified(settings, Path(merged).parents[2])
    try:
        paths = [Path(lower) if os.path.isabs(lower) else Path.cwd() / lower for lower in lower_dirs(options)]
        # A local image's squash file only as an unpacked copy below kernel overlayfs: squashfuse
        # reads no faster than fuse-overlayfs over the local layers (bench: login node after a pull),
        # and with options only fuse-overlayfs takes (--userns keep-id's uidmapping=) the local layers
        # work, squashfuse below fuse-overlayfs does not (podman-hpc's #83: "creating /etc/mtab symlink").
        wanted = settings.unpacks and settings.kernel_overlay and kernel_options(options, ["-"]) is not None
        whole = squash_of_local_image(paths, Path(merged).parents[2], _podman_stores()) if wanted else None
        root = _squash_lower(*whole, settings, state_dir, held, verified, instead="the local layers") if whole else ""
        if whole and root:
            log(f"local image {paths[0]} read from its squashed copy {whole[0]}")
            lowers.append(root)
        else:
            for lower, path in zip(lower_dirs(options), paths, strict=True):
                found = squash_of(path)
                if found is None:
                    all_squashed = False
                    lowers.append(lower)
                else:
                    lowers.append(_squash_lower(*found, settings, state_dir, held, verified))
        mounted = (
            bool(held)
            and all_squashed
            and settings.kernel_overlay
            and _kernel_overlay(options, lowers, merged, state_dir)
        )
        code = 0 if mounted else _fuse_overlay(_with_lowers(argv, lowers))
    except EngineError as err:  # a squash file that is not its record's: one line, in podman's error
        _release(held)
        log(str(err))
        sys.stderr.write(f"podman-hpc-mount: {err}")
        return 1
    except BaseException:
        _release(held)
        raise
    if code != 0 or not held:
        _release(held)
        return code
    try:
        os.chmod(merged, 0o755)
    except OSError as err:  # fuse-overlayfs outside a user namespace: its root stays as it is
        log(f"cannot chmod {merged}: {err}")
    if _detach():
        try:
            wait_for_unmount(merged)
        finally:
            _release(held)
        os._exit(0)
    return 0


class _Verified:
    """The node's record of checked squash files, made on first use (``squashcheck``)."""

    def __init__(self, settings: ReadPathSettings, graph_root: Path):
        self.directory = verified_dir(settings.unpack_dir, str(graph_root))
        self.files: VerifiedFiles | None = None

    def __call__(self) -> VerifiedFiles:
        if self.files is None:
            self.files = VerifiedFiles(own_dir(self.directory))
        return self.files


def _squash_lower(
    squash: Path,
    lower: Path,
    digests: set[str],
    settings: ReadPathSettings,
    state_dir: Path,
    held: list,
    verified: _Verified,
    instead: str = "squashfuse",
) -> str:
    """The directory that stands for a squashed lower: an unpacked copy, else a squashfuse mount,
    of a squash file that matches its record; with ``instead`` other than squashfuse, '' when there
    is no unpacked copy (the caller keeps what ``instead`` names)."""
    # <store>/overlay/l/<link>.squash, opened without following links, checked through this descriptor
    fd = Tree(squash.parents[2]).open(("overlay", "l"), squash.name)
    try:
        if not check(fd, squash, digests, verified()):
            log(f"{squash}: no digest recorded (squashed by podman-hpc 1.2.2 or before the check): not checked")
        declined = settings.unpacks and settings.auto_declines(os.fstat(fd).st_size)
        if declined:
            log(f"{squash}: {declined}")
            note_fallback(state_dir, declined)
        elif settings.unpacks:
            copy = UnpackedCopy(squash, Path(settings.unpack_dir), int(settings.unpack_max_mb * 2**20), source_fd=fd)
            try:
                root = copy.acquire()
            except (NoRoom, OSError) as err:
                log(f"unpacked copy refused: {err}")
                note_fallback(state_dir, f"no unpacked copy, {instead} instead: {err}")
                root = None
            for key, why in copy.removed:  # past their time, or made room: infohpc says which and why
                note_fallback(state_dir, f"removed unpacked copy {key}: {why}")
            if copy.lost:
                note_fallback(
                    state_dir,
                    f"unpacked copy {copy.key} of {squash.name} was gone from {copy.cache} "
                    "(removed outside podman-hpc): unpacked again",
                )
            if root is not None:
                log(f"{squash} unpacked at {root}")
                held.append(copy)
                return str(root)
        if instead != "squashfuse":
            return ""
        mount = SquashMount(squash, lower, mounts_dir(settings.unpack_dir, state_dir))
        mount.acquire()
        held.append(mount)
        if mount.revived:
            note_fallback(
                state_dir,
                f"the squashfuse mount of {squash.name} had died under its containers: mounted again for the next ones",
            )
        return str(mount.target)
    finally:
        os.close(fd)


def _kernel_overlay(options: list[str], lowers: list[str], merged: str, state_dir: Path) -> bool:
    """Mount kernel overlayfs; False (and a note) where the options or the node need fuse-overlayfs."""
    kernel = kernel_options(options, lowers)
    if kernel is None:
        log(f"options for fuse-overlayfs only: {options}")
        return False
    try:
        mount_overlay(merged, kernel)
    except OSError as err:
        log(f"kernel overlayfs refused: {err}")
        note_fallback(state_dir, f"kernel overlayfs refused ({err.strerror}), fuse-overlayfs instead")
        return False
    log(f"kernel overlayfs {kernel} on {merged}")
    return True


def _fuse_overlay(argv: list[str]) -> int:
    overlay = os.environ.get("FUSE_OVERLAYFS_BIN") or shutil.which("fuse-overlayfs") or "/usr/bin/fuse-overlayfs"
    log(f"{overlay} {' '.join(argv)}")
    return commands.run([overlay, *argv]).returncode


def _release(held: list) -> None:
    for lower in held:
        lower.release()


if __name__ == "__main__":
    sys.exit(main())
