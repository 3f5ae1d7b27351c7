"""podman-hpc 1.2.2, the upstream tool, works on the stack as a peer of ours.

The stack installs it (dev/stacklib/peer.py); these tests show it pulls,
squashes and runs an image as it does at a site, so compatibility tests and
benchmarks can put it side by side with ours.
"""

import json
import re
import shutil
from pathlib import Path

from tests.helpers.commands import run
from tests.helpers.peer import peer_env


def test_peer_reads_the_stack_config(peer, peer_home):
    result = run([peer.bin, "--squash-dir", peer_home / "squash", "infohpc"], env=peer_env(peer, peer_home))
    assert result.stdout.startswith("Podman-HPC Version: 1.2.2\n")
    # Lines like "mount_program (file: mount_program): /path": what it uses, from where.
    info = {m[1]: (m[2], m[3]) for m in re.finditer(r"^(\w+) \((.+?)\): (.*)$", result.stdout, re.M)}
    from_file = {key: value for key, (source, value) in info.items() if source == f"file: {key}"}
    assert from_file["mount_program"] == str(peer.venv / "bin" / "fuse-overlayfs-wrap")
    assert Path(from_file["modules_dir"], "openmpi-pmix.yaml").is_file()
    hook = json.loads(Path(from_file["hooks_dir"], "02-hook_tool.json").read_text())
    assert hook["hook"]["path"] == str(peer.venv / "bin" / "hook_tool")
    mksquashfs = from_file["mksquashfs_bin"]
    assert run([mksquashfs, "-version"]).stdout.startswith("mksquashfs version 4.6")
    ldd = run(["ldd", mksquashfs], check=False)
    assert "not a dynamic executable" in ldd.stdout + ldd.stderr  # it runs inside any image


def test_peer_pulls_squashes_and_runs_from_the_squashed_store(stack, peer, peer_home):
    env = peer_env(peer, peer_home)
    work = stack.work_dir("peer")
    squash = work / "squash"
    try:
        result = run([peer.bin, "--squash-dir", squash, "pull", stack.base_image], env=env)
        # Its pull exits 0 even when the migration fails: check the store itself.
        assert f"INFO: Migrating image to {squash}" in result.stdout
        images = json.loads((squash / "overlay-images" / "images.json").read_text())
        (image,) = [i for i in images if stack.base_image in i.get("names", [])]
        layers = json.loads((squash / "overlay-layers" / "layers.json").read_text())
        assert image["layer"] in {layer["id"] for layer in layers}
        squashes = list((squash / "overlay" / "l").glob("*.squash"))
        assert len(squashes) == 1, squashes
        with squashes[0].open("rb") as f:
            assert f.read(4) == b"hsqs"  # a squashfs superblock
        link = (squash / "overlay" / image["layer"] / "link").read_text().strip()
        assert squashes[0].name == f"{link}.squash"  # the top layer's, as podman will look it up

        # Nothing left in the peer's own storage: the image must come from the squashed store.
        run(["podman", "unshare", "rm", "-rf", env["PODMANHPC_GRAPH_ROOT"], env["PODMANHPC_RUN_ROOT"]])
        assert not Path(env["PODMANHPC_GRAPH_ROOT"]).exists()
        listed = run(
            [peer.bin, "--squash-dir", squash, "images", "--format", "{{.Repository}}:{{.Tag}} {{.ReadOnly}}"], env=env
        )
        assert f"{stack.base_image} true" in listed.stdout.splitlines()
        result = run(
            [
                peer.bin,
                "--squash-dir",
                squash,
                "run",
                "--rm",
                "--network",
                "host",
                stack.base_image,
                "cat",
                "/etc/os-release",
            ],
            env=env,
        )
        assert "VERSION_CODENAME=bookworm" in result.stdout
        own_images = Path(env["PODMANHPC_GRAPH_ROOT"], "overlay-images", "images.json")
        assert not own_images.exists() or image["id"] not in own_images.read_text()
    finally:
        shutil.rmtree(work, ignore_errors=True)
