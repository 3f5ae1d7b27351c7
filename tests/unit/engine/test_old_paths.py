"""The entry points of the flat engine keep working: the console scripts of an install made
before the engine had rooms (an editable install is not regenerated when the package changes)
name ``jupyter_podman_hpc.engine.hook:main`` and ``jupyter_podman_hpc.engine.mount:main``, and
the OCI hook file in ``hooks_dir`` runs the first of them."""

import importlib

from jupyter_podman_hpc.engine.mount import program
from jupyter_podman_hpc.engine.site import hook


def entry_point(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def test_the_hook_s_old_entry_point_is_the_hook():
    assert entry_point("jupyter_podman_hpc.engine.hook:main") is hook.main


def test_the_mount_program_s_old_entry_point_runs_the_mount_program(monkeypatch):
    calls = []
    monkeypatch.setattr(program, "main", lambda: calls.append("mount"))
    entry_point("jupyter_podman_hpc.engine.mount:main")()
    assert calls == ["mount"]
