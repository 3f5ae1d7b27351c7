"""Per-user state planted by another user before its owner made it (engine/base/private.py).

/tmp and /dev/shm are world-writable: after a reboot or a tmp clean, anyone can create
``/tmp/<your uid>_hpc`` first. Each test has hpcoutsider plant what podman or the engine would
use from there (a containers.conf, a hook, an unpacked "image") and shows that the victim's next
command refuses in one line, runs nothing of the attacker's, and works once the plant is gone.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

ATTACK_SCRIPT = """#!/bin/sh
id -un > {marker}
exec "$@"
"""


@pytest.fixture
def marker(outsider):
    """Where the attacker's program would leave proof that it ran as the victim."""
    directory = Path(f"/tmp/jph-attack-{uuid.uuid4().hex[:8]}")
    outsider.sh("mkdir", "-m", "0777", directory)
    yield directory / "ran-as"
    outsider.sh("rm", "-rf", directory, check=False)


def attack_program(plant, marker: Path) -> Path:
    return plant(
        marker.parent.with_name(marker.parent.name + "-bin") / "evil", ATTACK_SCRIPT.format(marker=marker), mode="0755"
    )


def assert_refused(result, path: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 125, result.stderr
    assert len(lines) == 1 and "refusing to use" in lines[0] and path in lines[0], result.stderr
    assert "hpcoutsider" in lines[0], result.stderr  # names the owner
    assert "Traceback" not in result.stderr


def test_a_planted_containers_conf_never_starts_the_attackers_conmon(victim, stack, plant, marker):
    evil = attack_program(plant, marker)
    config_home = victim.env["PODMANHPC_CONFIG_HOME"]
    plant(f"{config_home}/containers/containers.conf", f'[engine]\nconmon_path = ["{evil}"]\n')

    result = victim("run", "--rm", stack.tiny_image, "true", check=False)
    assert_refused(result, victim.env["PODMANHPC_RUN_ROOT"])
    assert not marker.exists()

    victim_root = victim.env["PODMANHPC_RUN_ROOT"]
    victim.sh("test", "!", "-O", victim_root)  # still the attacker's: the victim changed nothing in it


def test_once_the_plant_is_gone_the_victims_state_is_private_and_runs(victim, stack, outsider):
    root = victim.env["PODMANHPC_RUN_ROOT"]
    outsider.sh("mkdir", "-m", "0777", root)
    assert victim("images", check=False).returncode == 125
    outsider.sh("rm", "-rf", root)

    assert victim("run", "--rm", stack.tiny_image, "echo", "ran").stdout.strip() == "ran"
    for key in ("PODMANHPC_RUN_ROOT", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_CONFIG_HOME", "PODMANHPC_SQUASH_UNPACK_DIR"):
        st = os.lstat(victim.env[key])
        assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0, (key, oct(st.st_mode))
    # and another user can no longer plant anything in it
    assert outsider.sh("mkdir", f"{victim.env['PODMANHPC_CONFIG_HOME']}/containers", check=False).returncode != 0


def test_a_planted_hook_is_never_run(victim, stack, plant, marker):
    evil = attack_program(plant, marker)
    hook = json.dumps(
        {"version": "1.0.0", "hook": {"path": str(evil)}, "when": {"always": True}, "stages": ["prestart"]}
    )
    plant(f"{victim.env['PODMANHPC_RUN_ROOT']}/hooks.d/01-evil.json", hook, mode="0444")

    result = victim("run", "--rm", stack.tiny_image, "true", check=False)
    assert_refused(result, victim.env["PODMANHPC_RUN_ROOT"])
    assert not marker.exists()


def test_a_planted_unpacked_copy_never_becomes_the_victims_root(victim, stack, plant, marker):
    unpack_dir = victim.env["PODMANHPC_SQUASH_UNPACK_DIR"]
    # an "unpacked image" whose every program is the attacker's
    plant(f"{unpack_dir}/0123456789abcdef0123456789abcdef/bin/sh", ATTACK_SCRIPT.format(marker=marker), mode="0755")

    result = victim("pull", stack.tiny_image, check=False)
    assert_refused(result, str(Path(unpack_dir).parent))
    assert not marker.exists()


def test_without_scratch_nothing_falls_back_to_a_shared_tmp_storage(victim, stack, outsider):
    shared = Path("/tmp/storage")
    planted = not shared.exists()
    if planted:  # the store every user would share, made by the attacker with its setgid bit
        outsider.sh("mkdir", "-m", "2777", shared)
    try:
        before = sorted(os.listdir(shared))
        pulled = victim.sh(
            "env", "-u", "SCRATCH", "-u", "SQUASH_DIR", "podman-hpc", "pull", stack.tiny_image, check=False
        )
        lines = pulled.stderr.strip().splitlines()
        assert pulled.returncode == 125 and len(lines) == 1, pulled.stderr
        assert "no squashed image store: SCRATCH is not set" in lines[0]
        assert sorted(os.listdir(shared)) == before  # nothing written into the shared directory
        # commands that need no squashed store still work without one
        images = victim.sh("env", "-u", "SCRATCH", "-u", "SQUASH_DIR", "podman-hpc", "images")
        assert "/tmp/storage" not in images.stdout + images.stderr
        # with a store of its own, the same pull works
        assert "squashed" in victim("pull", stack.tiny_image).stdout
    finally:
        if planted:
            outsider.sh("rm", "-rf", shared, check=False)
