"""The squashed image store on the real stack: migrate, run from it on every node, and
the ways podman-hpc 1.2.2 fails that we must not (kills, concurrency, re-tags)."""

import dataclasses
import json
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from tests.helpers.commands import run


def images_json(hpc):
    return json.loads((hpc.squash_dir / "overlay-images" / "images.json").read_text())


def squash_files(hpc):
    return sorted((hpc.squash_dir / "overlay" / "l").glob("*.squash"))


def build(hpc, tag, containerfile, context=None):
    context = context or hpc.work / f"ctx-{uuid.uuid4().hex[:6]}"
    context.mkdir(parents=True, exist_ok=True)
    (context / "Containerfile").write_text(containerfile)
    hpc("build", "-t", tag, context)
    return tag


def test_pull_migrate_then_run_from_the_store_on_every_node(hpc, stack):
    hpc("pull", stack.base_image)
    assert len(squash_files(hpc)) == 1
    assert any(stack.base_image in record["names"] for record in images_json(hpc))
    hpc.wipe_local_storage()  # the login node forgets it; the nodes never had it
    listing = hpc("images").stdout
    assert stack.base_image in listing and "squashed" in listing
    outputs = hpc.on_each_node("podman-hpc", "run", "--rm", stack.base_image, "cat", "/etc/os-release")
    assert sorted(outputs) == list(stack.nodes)
    assert all("VERSION_CODENAME=bookworm" in text for text in outputs.values())


def test_migrate_of_a_squashed_image_returns_at_once(stack, hpc):
    hpc("pull", stack.tiny_image)
    first = squash_files(hpc)[0].stat()
    again = hpc("migrate", stack.tiny_image)
    assert "already squashed" in again.stdout
    pulled = hpc("pull", stack.tiny_image)
    assert "already squashed" in pulled.stdout
    assert squash_files(hpc)[0].stat().st_mtime_ns == first.st_mtime_ns


def test_multi_layer_image_runs_from_the_store_with_deletions_applied(hpc, stack):
    tag = build(
        hpc,
        "localhost/tests/layers:1",
        f"""\
FROM {stack.tiny_image}
RUN echo one > /layer-one && echo doomed > /doomed && mkdir -p /data/sub && echo a > /data/a
RUN rm /doomed && echo two > /layer-two && rm -rf /data/sub
RUN echo three > /data/b && rm /data/a
""",
    )
    hpc("migrate", tag)
    hpc.wipe_local_storage()
    script = (
        "cat /layer-one /layer-two /data/b; ls /data; test -e /doomed || echo gone; test -d /data/sub || echo nosub"
    )
    out = hpc("run", "--rm", tag, "sh", "-c", script).stdout.split()
    assert out == ["one", "two", "three", "b", "gone", "nosub"]


def test_retag_moves_the_name_and_never_duplicates_it(hpc, stack):
    tag = "localhost/tests/retag:latest"
    build(hpc, tag, f"FROM {stack.tiny_image}\nRUN echo first > /version\n")
    hpc("migrate", tag)
    build(hpc, tag, f"FROM {stack.tiny_image}\nRUN echo second > /version\n")
    hpc("migrate", tag)
    named = [r for r in images_json(hpc) if tag in (r.get("names") or [])]
    assert len(named) == 1
    assert len(images_json(hpc)) == 2  # the first image stays, untagged
    hpc.wipe_local_storage()
    assert hpc("images").returncode == 0
    assert hpc("run", "--rm", tag, "cat", "/version").stdout.strip() == "second"


def test_rmsqi_untags_then_removes_and_keeps_shared_layers(hpc, stack):
    tag = build(hpc, "localhost/tests/rm:1", f"FROM {stack.tiny_image}\nRUN echo x > /x\n")
    hpc("tag", tag, "localhost/tests/rm:2")
    hpc("migrate", tag)
    hpc("pull", stack.tiny_image)
    assert len(squash_files(hpc)) == 2
    assert "untagged" in hpc("rmsqi", "localhost/tests/rm:2").stdout
    assert len(squash_files(hpc)) == 2
    hpc("rmsqi", tag)
    assert len(squash_files(hpc)) == 1
    layers = json.loads((hpc.squash_dir / "overlay-layers" / "layers.json").read_text())
    base_top = next(r["layer"] for r in images_json(hpc))
    assert any(layer["id"] == base_top for layer in layers)
    missing = hpc("rmsqi", tag, check=False)
    assert missing.returncode == 125 and "not in the squashed store" in missing.stderr


def test_a_killed_migrate_leaves_the_store_usable_and_a_retry_succeeds(hpc, stack):
    hpc("pull", stack.tiny_image)  # another image, already squashed: must keep working
    tag = build(
        hpc,
        "localhost/tests/killed:1",
        f"""\
FROM {stack.tiny_image}
RUN head -c 80000000 /dev/urandom > /blob
RUN echo done > /done
""",
    )
    interrupted = 0
    # early kills first: on a quiet machine the whole migration may take only about a second
    for delay in (0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.4, 2.0, 3.0):
        process = subprocess.Popen(
            ["podman-hpc", "migrate", tag], env=hpc.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(delay)
        process.send_signal(signal.SIGKILL)
        process.wait()
        names = [n for r in images_json(hpc) for n in r.get("names") or []]
        if tag in names:  # it finished before the kill: then it must be whole
            assert all(Path(f).stat().st_size > 0 for f in squash_files(hpc))
            break
        interrupted += 1
        assert hpc("images").returncode == 0
        assert "tiny" in hpc("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout
        hpc(
            "unshare",
            "podman",
            "--root",
            hpc.env["PODMANHPC_GRAPH_ROOT"],
            "--runroot",
            hpc.env["PODMANHPC_RUN_ROOT"],
            "image",
            "unmount",
            "--all",
            "--force",
            check=False,
        )
    assert interrupted >= 3, "the kills came too late to interrupt the migration"
    hpc("migrate", tag)
    hpc.wipe_local_storage()
    assert hpc("run", "--rm", tag, "cat", "/done").stdout.strip() == "done"
    leftovers = [p.name for p in (hpc.squash_dir / "overlay" / "l").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_the_same_image_migrated_from_four_nodes_at_once(hpc, stack):
    tag = f"{stack.registry}/tests/concurrent:{hpc.work.name}"
    build(hpc, tag, f"FROM {stack.tiny_image}\nRUN head -c 40000000 /dev/urandom > /blob && echo ok > /ok\n")
    hpc("push", tag)
    try:
        result = hpc.srun("-N4", "--ntasks-per-node=1", "podman-hpc", "pull", tag)
        assert result.stdout.count("squashed") == 4
        assert len(squash_files(hpc)) == 1
        assert len(images_json(hpc)) == 1
        outputs = hpc.on_each_node("podman-hpc", "run", "--rm", tag, "cat", "/ok")
        assert outputs == dict.fromkeys(stack.nodes, "ok")
    finally:
        run(["skopeo", "delete", "--tls-verify=false", f"docker://{tag}"], check=False)


def test_different_images_migrate_in_parallel(hpc, stack):
    tags = [build(hpc, f"localhost/tests/par:{i}", f"FROM {stack.tiny_image}\nRUN echo {i} > /i\n") for i in range(3)]
    processes = [
        subprocess.Popen(
            ["podman-hpc", "migrate", tag], env=hpc.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for tag in tags
    ]
    for process in processes:
        _out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
    assert len(squash_files(hpc)) == 3
    hpc.wipe_local_storage()
    for i, tag in enumerate(tags):
        assert hpc("run", "--rm", tag, "cat", "/i").stdout.strip() == str(i)


def test_no_mount_is_left_after_twenty_runs(squashed_tiny, stack):
    hpc = squashed_tiny
    for _ in range(20):
        assert hpc("run", "--rm", stack.tiny_image, "true").returncode == 0
    assert hpc.mounts() == []


@pytest.mark.parametrize("read_path, held", [("kernel", "squashfuse"), ("unpacked", "unpacked")])
def test_concurrent_containers_share_one_squash_mount_safely(squashed_tiny, stack, read_path, held):
    hpc = dataclasses.replace(squashed_tiny, env={**squashed_tiny.env, "PODMANHPC_SQUASH_READ_PATH": read_path})
    long = subprocess.Popen(["podman-hpc", "run", "--rm", stack.tiny_image, "sleep", "6"], env=hpc.env)
    time.sleep(3)
    for _ in range(3):  # short containers from the same image start and stop meanwhile
        hpc("run", "--rm", stack.tiny_image, "true")
    assert any(held in line for line in hpc.mounts())  # the long one still has its lower
    assert long.wait(timeout=60) == 0
    assert hpc.mounts() == []


def test_errors_are_one_line_with_podman_exit_codes(squashed_tiny, stack):
    hpc = squashed_tiny
    conflict = hpc("run", "--openmpi-pmix", "--openmpi-pmi2", "--rm", stack.tiny_image, "true", check=False)
    assert conflict.returncode == 125
    assert conflict.stderr.strip().startswith("Error: module 'openmpi-pmix' (--openmpi-pmix) conflicts")
    assert len(conflict.stderr.strip().splitlines()) == 1
    missing = hpc("migrate", "localhost/no/such:image", check=False)
    assert missing.returncode == 125
    assert "not found in the local storage" in missing.stderr
    unknown = hpc("run", "--rm", f"{stack.registry}/no/such:image", "true", check=False)
    assert unknown.returncode == 125 and "Error" in unknown.stderr
    bad = hpc("--squash-dir", check=False)
    assert bad.returncode == 125 and "needs a value" in bad.stderr
