"""Files in a shared store are opened without following links, and only files the engine has
just created are chmod-ed (engine/store/fs.py, engine/base/files.py, engine/base/locks.py).

hpcuser2 (the ``member``) swaps a lock file of the project store for a symbolic link to
hpcuser's (the ``victim``'s) ssh key. The victim's next migrate used to make that key 0660 and
overwrite its start with a lock token; now it is refused in one line, the key keeps its mode
and content, and migrate works once the link is gone.
"""

from __future__ import annotations

import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from tests.helpers.attacks import build, in_store
from tests.helpers.commands import run

KEY = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"


@pytest.fixture
def ssh_key():
    """A private file of the victim's, as ~/.ssh/id_ed25519 is."""
    directory = Path.home() / f".jph-sec-{uuid.uuid4().hex[:8]}"
    directory.mkdir(mode=0o700)
    key = directory / "id_ed25519"
    key.write_text(KEY)
    key.chmod(0o600)
    yield key
    run(["rm", "-rf", str(directory)], check=False)


def intact(key: Path) -> bool:
    return key.read_text() == KEY and stat.S_IMODE(key.stat().st_mode) == 0o600


def image_id(hpc, tag: str) -> str:
    return hpc("image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()


def squashed_names(store: Path) -> list[str]:
    return [n for r in json.loads((store / "overlay-images" / "images.json").read_text()) for n in r.get("names", [])]


@pytest.mark.parametrize("lock", ["records", "image"])
def test_a_lock_file_swapped_for_a_link_to_the_victims_key_is_refused(
    victim, member, project_store, ssh_key, stack, lock
):
    victim = in_store(victim, project_store)
    victim("pull", stack.tiny_image)  # the store exists, with the victim's lock files
    tag = build(
        victim,
        f"localhost/tests/locks:{uuid.uuid4().hex[:6]}",
        f"FROM {stack.tiny_image}\nRUN echo {uuid.uuid4().hex} > /id\n",
    )
    if lock == "records":  # the victim's images.lock (its directory is writable by every member)
        path = project_store / "overlay-images" / "images.lock"
        member.sh("sh", "-c", 'rm -f "$1" && ln -s "$2" "$1"', "sh", path, ssh_key)
    else:  # the per-image lock of the image the victim is about to squash, planted before it exists
        path = project_store / ".locks" / f"{image_id(victim, tag)}.lock"
        member.sh("ln", "-s", ssh_key, path)
    assert path.is_symlink() and path.lstat().st_uid != os.getuid()

    refused = victim("migrate", tag, check=False)
    assert refused.returncode == 125, refused
    assert refused.stderr.strip().splitlines() == [
        f"Error: refusing to use {path}: it is a symbolic link (another member of the store's group may have "
        "put it there); remove it, or ask its owner to"
    ], refused.stderr
    assert intact(ssh_key), "the victim's key was chmod-ed or written to"
    assert tag not in squashed_names(project_store)

    victim.sh("rm", path)  # the record directories are not sticky: the victim removes the link
    victim("migrate", tag)
    assert tag in squashed_names(project_store) and intact(ssh_key)
    victim.wipe_local_storage()
    assert victim("run", "--rm", tag, "cat", "/id").stdout.strip()
