"""A server's kernel pools over its life: the default it sets for its process, the kernelspecs it
warms (only those nobody but the user and root could have written), and what its stop undoes
(pytest-jupyter runs servers one after another in one process; a pool left there would pool
every later kernel of the process). Real pools of real containers: tests/integration/kernels/test_pool.py."""

from __future__ import annotations

import logging
import os
import threading

from traitlets.config import Config

from jupyter_podman_hpc.kernels import kernelspec
from jupyter_podman_hpc.kernels import pool as pools
from jupyter_podman_hpc.server.backend import Backend, PodmanHPC


class StandInPool:
    closed = False

    def close(self) -> None:
        self.closed = True


def test_a_stopping_server_closes_its_pools_and_leaves_its_process_pooling_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(kernelspec, "list_kernels", list)
    backend = Backend(PodmanHPC(config=Config({"PodmanHPC": {"kernel_pool": 2}})), str(tmp_path))
    backend.start_kernel_pools()
    assert pools.default_size == 2 and pools.default_dirs == (str(tmp_path.resolve()),)
    standing = pools.get("spec:1", StandInPool)

    backend.close_kernel_pools()
    assert pools.default_size == 0 and pools.default_dirs == ()
    assert standing.closed and pools.find("spec:1") is None


def test_no_pool_starts_once_the_server_is_stopping(monkeypatch, tmp_path):
    from jupyter_podman_hpc.kernels.provisioner import PodmanHPCProvisioner

    warmed: list[str] = []
    first_started, go_on = threading.Event(), threading.Event()

    def warm(name, *args):
        warmed.append(name)
        first_started.set()
        go_on.wait(5)

    monkeypatch.setattr(PodmanHPCProvisioner, "warm", staticmethod(warm))
    backend = Backend(PodmanHPC(), str(tmp_path))
    backend.warm_kernel_pools(["a", "b"])
    assert first_started.wait(5)
    closing = threading.Thread(target=backend.close_kernel_pools)
    closing.start()  # it waits for the warming thread, which stops before "b"
    assert backend._pools_closing.wait(5)
    go_on.set()
    closing.join(10)
    assert not closing.is_alive() and warmed == ["a"]


def test_a_kernelspec_others_could_write_is_not_warmed_and_the_log_says_why(monkeypatch, tmp_path, caplog):
    for name, where in (
        ("PODMANHPC_GRAPH_ROOT", "graph"),
        ("PODMANHPC_RUN_ROOT", "run"),
        ("PODMANHPC_CONFIG_HOME", "config"),
        ("SQUASH_DIR", "squash"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_PATH", "shared/share/jupyter"),
    ):
        monkeypatch.setenv(name, str(tmp_path / where))
    image = "127.0.0.1:5000/jph/base:bookworm"
    kernelspec.install(image, name="own", pool=1)  # the user's data dir
    planted = kernelspec.install(image, name="planted", prefix=tmp_path / "shared", pool=1)
    os.chmod(planted.path, 0o2775)  # what a project member could have written into
    started: list[str] = []
    monkeypatch.setattr(pools, "get", lambda key, make: started.append(key.split(":")[0]))

    backend = Backend(PodmanHPC(), str(tmp_path))
    with caplog.at_level(logging.WARNING):
        backend.start_kernel_pools()
        for thread in backend._warming:
            thread.join(30)
    backend.close_kernel_pools()
    assert started == ["own"]
    [why] = [r for r in caplog.records if "planted" in r.getMessage()]
    assert why.levelno == logging.WARNING and why.getMessage().startswith("podman-hpc: no kernel pool for planted: ")
    assert f"{planted.path} is " in why.getMessage() and "others may write into it" in why.getMessage()
