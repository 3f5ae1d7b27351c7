"""Pull events and the pull's failure messages (no podman needed)."""

import pytest

from jupyter_podman_hpc.engine.errors import InvalidReference
from jupyter_podman_hpc.engine.images.pull import _lost_registry, _pull_event, _storage_full, pull
from jupyter_podman_hpc.engine.site.config import load_config


def test_pull_events_carry_bytes_per_layer():
    events, totals = [], {}
    for event in [
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 10, "total": 100}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 60, "total": 100}, "id": "aaa"},
        {"status": "Already exists", "progressDetail": {}, "id": "bbb"},
        {"status": "Download complete", "progressDetail": {}, "id": "aaa"},
    ]:
        _pull_event(event, totals, events.append)
    assert [(e.message, e.current, e.total, e.item) for e in events] == [
        ("Pulling fs layer aaa", 0, None, "aaa"),
        ("Downloading aaa", 10, 100, "aaa"),
        ("Downloading aaa", 60, 100, "aaa"),
        ("Already exists bbb", None, None, "bbb"),
        ("Download complete aaa", 100, 100, "aaa"),
    ]
    assert all(e.stage == "pull" for e in events)


@pytest.mark.parametrize(
    "failure, said",
    [
        (
            'writing blob: storing blob to file "/var/tmp/storage1/2": happened during read: unexpected EOF',
            "cannot pull 127.0.0.1:5999/team/x:1: the registry 127.0.0.1:5999 stopped answering during the pull "
            "(unexpected EOF): pull again once it answers",
        ),
        (
            "initializing source docker://127.0.0.1:5999/team/x:1: pinging container registry 127.0.0.1:5999: "
            'Get "http://127.0.0.1:5999/v2/": dial tcp 127.0.0.1:5999: connect: connection refused',
            "cannot pull 127.0.0.1:5999/team/x:1: the registry 127.0.0.1:5999 stopped answering during the pull "
            "(connection refused): pull again once it answers",
        ),
        ("reading manifest 1 in 127.0.0.1:5999/team/x: manifest unknown", None),
    ],
)
def test_a_registry_lost_mid_pull_is_said_as_such(failure, said):
    ref = "127.0.0.1:5999/team/x:1"
    lost = _lost_registry(ref, failure)
    assert (f"cannot pull {ref}: {lost}" if lost else None) == said


@pytest.mark.parametrize(
    "failure, full",
    [
        (
            'writing blob: adding layer with blob "sha256:1f": '
            "processing tar file(write /blob: no space left on device): exit status 1",
            True,
        ),
        ("reading manifest 1 in 127.0.0.1:5999/team/x: manifest unknown", False),
    ],
)
def test_a_graph_root_that_filled_is_said_as_such(tmp_path, failure, full):
    config = load_config({"PODMANHPC_GRAPH_ROOT": str(tmp_path)})  # a file system with room: the words decide
    said = _storage_full(config, "127.0.0.1:5999/team/x:1", failure)
    assert (
        said.startswith(f"cannot pull 127.0.0.1:5999/team/x:1: the node-local storage {tmp_path} is full (ENOSPC, ")
        if full
        else said == ""
    )


def test_pull_rejects_a_bad_reference_before_starting_podman(tmp_path):
    config = load_config({"PODMANHPC_RUN_ROOT": str(tmp_path / "run")})
    with pytest.raises(InvalidReference):
        pull(config, "BAD REF")
    assert not (tmp_path / "run").exists()
