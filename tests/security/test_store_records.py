"""Store records are data, never paths (engine/store/records.py, engine/store/fs.py).

In a project store every member of the group writes the records. hpcuser2 (the ``member``)
appends layer records whose ids lead out of the store, to a directory in hpcuser's home (the
``victim``): as a path, ``/home/...``, as ``../../..``, and as a valid id whose layer directory
is a link there. The victim's next ``rmsqi`` of an unrelated image used to delete that
directory; now it removes that image only, says once that it ignored the records, and every
other image stays usable.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.helpers.attacks import build, in_store
from tests.helpers.commands import run

APPEND_RECORDS = r"""
import json, sys
path, ids = sys.argv[1], sys.argv[2:]
with open(path) as source:
    records = json.load(source)
records += [{"id": i} for i in ids]
with open(path, "w") as out:  # in place, as podman-hpc 1.2.2 writes its records
    json.dump(records, out)
"""


@pytest.fixture
def precious():
    """A directory of the victim's, outside every store: what the attack aims at."""
    path = Path.home() / f".jph-sec-{uuid.uuid4().hex[:8]}"
    (path / "thesis").mkdir(parents=True)
    (path / "thesis" / "chapter1.tex").write_text("years of work\n")
    yield path / "thesis"
    run(["rm", "-rf", str(path)], check=False)


def squash_files(store: Path) -> list[Path]:
    return sorted((store / "overlay" / "l").glob("*.squash"))


def test_layer_records_that_lead_out_of_the_store_are_never_removed(victim, member, project_store, precious, stack):
    victim = in_store(victim, project_store)
    victim("pull", stack.tiny_image)
    unrelated = build(
        victim, f"localhost/tests/unrelated:{uuid.uuid4().hex[:6]}", f"FROM {stack.tiny_image}\nRUN echo mine > /mine\n"
    )
    victim("migrate", unrelated)
    assert len(squash_files(project_store)) == 2

    # the attack, as hpcuser2: records whose ids are paths to the victim's directory ...
    overlay = project_store / "overlay"
    relative = "../" * (len(overlay.parts) - 1) + str(precious).lstrip("/")
    assert (overlay / relative).resolve() == precious
    linked = uuid.uuid4().hex * 2  # ... and a valid id whose layer directory is a link there
    member.sh("ln", "-s", precious, overlay / linked)
    layers = project_store / "overlay-layers" / "layers.json"
    member.sh("python3", "-c", APPEND_RECORDS, layers, str(precious), relative, linked)
    planted = json.loads(layers.read_text())[-3:]
    assert [r["id"] for r in planted] == [str(precious), relative, linked]

    removed = victim("rmsqi", unrelated)
    assert "removed " in removed.stdout
    assert (precious / "chapter1.tex").read_text() == "years of work\n", "the victim's directory was touched"
    assert "ignoring 2 record(s)" in removed.stderr and "never acted on" in removed.stderr, removed.stderr
    assert (overlay / linked).is_symlink()  # the member's link is left, not followed
    # the unrelated image is gone, the tiny image is whole and runs from the store
    assert len(squash_files(project_store)) == 1
    victim.wipe_local_storage()
    listing = victim("images").stdout
    assert unrelated not in listing and stack.tiny_image in listing
    assert "ID=tiny" in victim("run", "--rm", stack.tiny_image, "cat", "/etc/os-release").stdout

    # a normal rmsqi still works, and still leaves the victim's directory alone
    victim("rmsqi", stack.tiny_image)
    assert squash_files(project_store) == [] and stack.tiny_image not in victim("images").stdout
    assert (precious / "chapter1.tex").read_text() == "years of work\n"


def test_an_image_record_whose_id_is_a_path_is_neither_listed_nor_removed(
    victim, member, project_store, precious, stack
):
    victim = in_store(victim, project_store)
    victim("pull", stack.tiny_image)
    images = project_store / "overlay-images" / "images.json"
    member.sh(
        "python3",
        "-c",
        r"""
import json, sys
path, target, name = sys.argv[1:]
records = json.load(open(path))
records.append({"id": target, "layer": target, "names": [name]})
json.dump(records, open(path, "w"))
""",
        images,
        str(precious),
        "localhost/tests/bait:1",
    )
    refused = victim("rmsqi", "localhost/tests/bait:1", check=False)
    assert refused.returncode == 125, refused
    assert [line for line in refused.stderr.splitlines() if line.startswith("Error:")] == [
        f"Error: image localhost/tests/bait:1 is not in the squashed store {project_store}"
    ]
    assert (precious / "chapter1.tex").read_text() == "years of work\n"
    assert "bait" not in victim("images").stdout
    victim("rmsqi", stack.tiny_image)  # the normal flow
    assert squash_files(project_store) == []
    assert any(r.get("names") == ["localhost/tests/bait:1"] for r in json.loads(images.read_text())), (
        "the member's record is left as it was, not acted on"
    )
