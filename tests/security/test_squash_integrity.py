"""A squash file changed after it was squashed is refused before it is mounted or unpacked
(engine/store/squashcheck.py, the mount program), and in a sticky project store a member cannot
change another's squash file at all.

In a project store made before this check (directories 2770, squash files 0660, as podman-hpc
1.2.2 and earlier versions of ours left them), hpcuser2 (the ``member``) rewrites the squash
file of an image hpcuser (the ``victim``) squashed, in place or by replacing it. The victim's
next run on a node is refused in one line naming the file, nothing runs, and after squashing
the image again it runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import uuid
from pathlib import Path

import pytest

from tests.helpers.attacks import in_store
from tests.helpers.commands import run

REWRITE = r"""
import os, sys
path, how = sys.argv[1:]
if how == "in-place":  # same size, one block changed: the kind of change a mount would not notice
    with open(path, "r+b") as out:
        out.seek(os.path.getsize(path) // 2)
        out.write(b"\0" * 4096)
else:  # a copy with the change, renamed over the victim's file
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2:len(data) // 2 + 4096] = b"\0" * 4096
    tmp = path + ".member"
    with open(tmp, "wb") as out:
        out.write(data)
    os.replace(tmp, path)
"""

TRY_EVERYTHING = r"""
import os, sys
path = sys.argv[1]
for what, action in (("write", lambda: open(path, "r+b").write(b"\0")),
                     ("replace", lambda: (open(path + ".member", "wb").close(), os.replace(path + ".member", path))),
                     ("remove", lambda: os.unlink(path))):
    try:
        action()
        print(what, "done")
    except OSError as err:
        print(what, type(err).__name__)
"""


def project_store(mode: int) -> Path:
    path = Path(os.environ["STACK_PROJECT_DIR"]) / f"sec-squash-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    path.chmod(mode)
    return path


@pytest.fixture
def stores(member):
    made: list[Path] = []

    def make(mode: int) -> Path:
        made.append(project_store(mode))
        return made[-1]

    yield make
    for path in made:
        member.sh("rm", "-rf", path, check=False)
        run(["rm", "-rf", str(path)], check=False)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def the_squash_file(store: Path) -> Path:
    files = sorted((store / "overlay" / "l").glob("*.squash"))
    assert len(files) == 1, files
    return files[0]


@pytest.mark.parametrize("how", ["in-place", "replace"])
def test_a_squash_file_a_member_changed_is_refused_before_it_is_mounted(victim, member, stores, stack, how):
    store = stores(0o2770)
    victim = in_store(victim, store)
    victim("pull", stack.tiny_image)
    record = json.loads((store / "overlay-images" / "images.json").read_text())[0]
    squash = the_squash_file(store)
    assert record["flags"]["podman-hpc.squash-digest"] == f"sha256:{sha256(squash)}"
    # the store as earlier versions (and podman-hpc 1.2.2) left it: no sticky bits, squash files 0660
    run(["chmod", "-R", "g+w,-t", str(store)])
    before = sha256(squash)

    member.sh("python3", "-c", REWRITE, squash, how)  # the attack, as hpcuser2
    assert sha256(squash) != before

    victim.wipe_local_storage()  # run from the store, as on a node that never pulled it
    node = stack.nodes[0]
    refused = victim.srun("-w", node, "podman-hpc", "run", "--rm", stack.tiny_image, "echo", "it ran", check=False)
    assert refused.returncode != 0 and "it ran" not in refused.stdout, refused
    errors = [line for line in refused.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, refused.stderr
    assert (
        f"squash file {squash} does not match its record: it was changed after it was squashed; squash the image again"
    ) in errors[0], errors[0]
    assert sum("does not match its record" in line for line in refused.stderr.splitlines()) == 1
    assert victim.mounts(node) == []  # nothing was mounted or left mounted

    # squash it again: pull makes it local, migrate sees the file changed and squashes anew
    again = victim("pull", stack.tiny_image)
    assert "already squashed" not in again.stdout and "squashed" in again.stdout, again.stdout
    squash = the_squash_file(store)
    assert sha256(squash) == json.loads((store / "overlay-images" / "images.json").read_text())[0]["flags"][
        "podman-hpc.squash-digest"
    ].removeprefix("sha256:")
    victim.wipe_local_storage()
    ran = victim.srun("-w", node, "podman-hpc", "run", "--rm", stack.tiny_image, "cat", "/etc/os-release")
    assert "ID=tiny" in ran.stdout


def test_in_a_sticky_project_store_a_member_can_neither_rewrite_nor_replace_a_squash_file(
    victim, member, stores, stack
):
    store = stores(0o3770)
    victim = in_store(victim, store)
    victim("pull", stack.tiny_image)
    squash = the_squash_file(store)
    assert stat.S_IMODE(squash.stat().st_mode) == 0o640  # written once, by its maker
    assert stat.S_IMODE(squash.parent.stat().st_mode) == 0o3770
    before = sha256(squash)

    tried = member.sh("python3", "-c", TRY_EVERYTHING, squash).stdout.split("\n")
    assert tried[:3] == ["write PermissionError", "replace PermissionError", "remove PermissionError"], tried
    # nor may the member remove the victim's image (its records would go, its files stay)
    member = in_store(member, store)
    refused = member("rmsqi", stack.tiny_image, check=False)
    assert refused.returncode == 125 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    short_id = json.loads((store / "overlay-images" / "images.json").read_text())[0]["id"][:12]
    assert refused.stderr.startswith(f"Error: cannot remove {short_id} from the image store {store}: ")
    assert "only a file's owner" in refused.stderr and f"ask {stack.user} to run" in refused.stderr

    assert sha256(squash) == before and stack.tiny_image in victim("images").stdout
    victim.wipe_local_storage()
    assert "ID=tiny" in victim("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout
