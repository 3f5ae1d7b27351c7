"""Full disks on the real stack: the squashed store's file system fills during a migrate, the
node-local storage (graph root) during a pull, the unpack cache's tmpfs during an unpack. Each
says in one line what is full; the store keeps no partial squash file and the image squashed
before still runs; a failed pull keeps no image; the read path falls back to squashfuse; once
there is room again the same command works."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest

from tests.helpers.faults import one_line, own_mounts

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def build(hpc, stack, tag: str, step: str) -> str:
    context = hpc.work / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN {step}\n")
    hpc("build", "-q", "-t", tag, context)
    return tag


def store_files(hpc) -> list[str]:
    """Every file of the squashed store but its lock files, hidden ones (partial squash files,
    temporary records) too."""
    return sorted(
        str(p.relative_to(hpc.squash_dir))
        for p in hpc.squash_dir.rglob("*")
        if (p.is_file() or p.is_symlink()) and not p.name.endswith(".lock")
    )


def squashed_names(hpc) -> list[str]:
    records = json.loads((hpc.squash_dir / "overlay-images" / "images.json").read_text())
    return sorted(name for record in records for name in record.get("names") or [])


def fresh_node(hpc):
    """``hpc`` as on a node that never pulled anything: an empty graph root of its own (under the
    test's run root, removed with it), the same squashed store."""
    root = f"{hpc.env['PODMANHPC_RUN_ROOT']}/fresh"
    return dataclasses.replace(
        hpc, env={**hpc.env, "PODMANHPC_RUN_ROOT": root, "PODMANHPC_GRAPH_ROOT": f"{root}/storage"}
    )


def test_a_store_that_fills_during_migrate_says_so_keeps_nothing_and_works_once_freed(hpc, stack, small_fs):
    fs = small_fs(48)
    hpc.squash_dir = fs.path / "store"
    hpc.env["SQUASH_DIR"] = str(hpc.squash_dir)
    hpc("pull", stack.tiny_image)  # squashed there before the disk fills
    big = build(hpc, stack, "localhost/faults/big:1", "head -c 24000000 /dev/urandom > /random")
    before = store_files(hpc)
    filler = fs.fill(leave_mb=12)

    result = hpc("migrate", big, check=False)
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert line.startswith(f"Error: the squashed store {hpc.squash_dir} is full (ENOSPC, "), line
    assert f"): {big} was not squashed after " in line, line
    assert store_files(hpc) == before  # no partial squash file, no record of it
    assert squashed_names(hpc) == [stack.tiny_image]
    node = fresh_node(hpc)  # the image squashed before runs from the full store
    assert node("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout.startswith('NAME="jph tiny"')

    filler.unlink()  # room again: the same command squashes it
    assert hpc("migrate", big).stdout.startswith(f"squashed: {big} ")
    assert squashed_names(hpc) == sorted([big, stack.tiny_image])
    assert node("run", "--rm", big, "wc", "-c", "/random").stdout.split()[0] == "24000000"
    assert own_mounts(hpc) == []
    assert node("ps", "-a", "--format", "{{.Names}}").stdout.strip() == ""


def test_an_unpack_cache_that_fills_during_unpack_falls_back_to_squashfuse(hpc, stack, small_tmpfs):
    # 40 MiB of one letter: a squash file of a few hundred KiB, which the read path expects to unpack
    # into about three times that, so the cache's room check passes and the unpack itself fills it.
    image = build(hpc, stack, "localhost/faults/letters:1", "yes abcdefgh | head -c 41943040 > /letters")
    hpc("migrate", image)
    hpc.wipe_local_storage()
    hpc.env["PODMANHPC_SQUASH_READ_PATH"] = "unpacked"  # unpack on this login node too
    gone = small_tmpfs(hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"], 16)

    result = hpc("run", "--rm", image, "wc", "-c", "/letters")
    assert result.stdout.split()[0] == "41943040" and result.stderr == ""
    cache = hpc.env["PODMANHPC_SQUASH_UNPACK_DIR"]
    left = hpc.sh("podman", "unshare", "sh", "-c", f'cd "{cache}" && ls -A; df -k . | tail -1').stdout
    print(f"left in the full cache: {left!r}")
    # the unpack that failed left no half tree, and no empty ref for the sweep to find
    assert ".tmp-" not in left and ".ref" not in left, left
    info = hpc("infohpc").stdout
    fell_back = [line for line in info.splitlines() if line.startswith(" fell back: ")]
    assert (
        len(fell_back) == 1
        and f"no unpacked copy, squashfuse instead: the unpack cache {cache} is full "
        "(ENOSPC, 0 MiB free) while unpacking "
        in fell_back[0]
    ), info
    assert own_mounts(hpc) == []

    gone()  # the cache has room again: the next container gets its unpacked copy
    result = hpc("run", "--rm", image, "sh", "-c", "wc -c /letters; grep ' / ' /proc/self/mountinfo")
    assert result.stdout.split()[0] == "41943040"
    copies = hpc.sh("podman", "unshare", "sh", "-c", f'ls -A "{cache}"').stdout.split()
    assert any(name.endswith(".ref") for name in copies) and any(len(name) == 32 for name in copies), copies
    assert own_mounts(hpc) == []


def test_a_graph_root_that_fills_during_pull_says_so_keeps_no_image_and_pulls_once_freed(
    hpc, stack, small_fs, pushed_image
):
    fs = small_fs(64, podman_storage=True)
    root = fs.path / "storage"
    hpc.env["PODMANHPC_GRAPH_ROOT"] = str(root)
    hpc("pull", stack.tiny_image)  # the node's storage holds an image before the disk fills
    filler = fs.fill(leave_mb=6)  # the pushed image's layer is 12 MB that do not compress
    free_before = fs.free()

    result = hpc("pull", pushed_image, check=False)
    assert result.returncode == 125
    line = one_line(result.stderr)
    assert line.startswith(f"Error: cannot pull {pushed_image}: the node-local storage {root} is full (ENOSPC, "), line
    assert hpc("image", "exists", pushed_image, check=False).returncode == 1
    assert pushed_image not in squashed_names(hpc)
    # what podman wrote of the layer before the disk filled was removed with the failed pull
    assert fs.free() >= free_before - (1 << 20), (fs.free(), free_before)
    assert hpc("run", "--rm", stack.tiny_image, "true").returncode == 0  # the image pulled before still runs

    filler.unlink()  # room again: the same command pulls and squashes it
    assert hpc("pull", pushed_image).stdout.startswith(f"squashed: {pushed_image} ")
    assert hpc("run", "--rm", pushed_image, "wc", "-c", "/blob").stdout.split()[0] == "12000000"
    assert own_mounts(hpc) == []
    hpc("rmi", "--all", "--force")  # podman's files on the small file system: gone before it is unmounted
