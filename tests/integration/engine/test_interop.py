"""Compatibility with the site's podman-hpc 1.2.2: each runs the images the other squashed."""

import uuid

import pytest

from tests.helpers.commands import run
from tests.helpers.peer import peer_env


@pytest.fixture(scope="module")
def layered_image(stack):
    """A three-layer image in the registry, with a deletion in an upper layer."""
    reference = f"{stack.registry}/tests/interop:{uuid.uuid4().hex[:10]}"
    context = stack.work_dir("interop-ctx")
    (context / "Containerfile").write_text(
        f"FROM {stack.tiny_image}\n"
        "RUN echo base > /marker && echo doomed > /doomed\n"
        "RUN rm /doomed && echo upper >> /marker\n"
    )
    run(["podman", "build", "--network", "host", "-t", reference, context])
    run(["podman", "push", reference])
    run(["podman", "rmi", reference])
    yield reference
    run(["skopeo", "delete", "--tls-verify=false", f"docker://{reference}"], check=False)


def peer_runs(peer, home, squash_dir, image):
    env = peer_env(peer, home)
    return run(
        [
            peer.bin,
            "--squash-dir",
            squash_dir,
            "run",
            "--rm",
            "--network",
            "host",
            image,
            "sh",
            "-c",
            "cat /marker; test -e /doomed || echo no-doomed",
        ],
        env=env,
    ).stdout.split()


def test_an_image_we_squashed_runs_under_podman_hpc_1_2_2(hpc, peer, peer_home, layered_image):
    hpc("pull", layered_image)
    listed = run(
        [peer.bin, "--squash-dir", hpc.squash_dir, "images", "--format", "{{.Repository}}:{{.Tag}} {{.ReadOnly}}"],
        env=peer_env(peer, peer_home),
    )
    assert f"{layered_image} true" in listed.stdout.splitlines()
    assert peer_runs(peer, peer_home, hpc.squash_dir, layered_image) == ["base", "upper", "no-doomed"]


def test_an_image_podman_hpc_1_2_2_squashed_runs_under_ours(hpc, peer, peer_home, layered_image):
    env = peer_env(peer, peer_home)
    run([peer.bin, "--squash-dir", hpc.squash_dir, "pull", layered_image], env=env)
    assert list(hpc.squash_dir.glob("overlay/l/*.squash")), "the peer did not squash the image"
    listing = hpc("images").stdout
    assert layered_image in listing and "squashed" in listing
    out = hpc("run", "--rm", layered_image, "sh", "-c", "cat /marker; test -e /doomed || echo no-doomed")
    assert out.stdout.split() == ["base", "upper", "no-doomed"]
    # and on a compute node, from the same store
    node = hpc.srun("-N1", "-w", "n3", "podman-hpc", "run", "--rm", layered_image, "cat", "/marker")
    assert node.stdout.split() == ["base", "upper"]
    hpc("rmsqi", layered_image)
    assert not list(hpc.squash_dir.glob("overlay/l/*.squash"))
