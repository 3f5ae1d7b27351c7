"""The exclusive lock containers/storage takes (lockf), held against other threads and processes."""

import os
import subprocess
import sys
import threading
import time

from jupyter_podman_hpc.engine.base.locks import lockf_held


def open_lock(path):
    return lambda: os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)


def test_a_second_thread_waits_for_the_lock(tmp_path):
    path = tmp_path / "images.lock"
    order = []
    with lockf_held(str(path), open_lock(path)) as fd:
        assert os.fstat(fd).st_ino == path.stat().st_ino

        def second():
            with lockf_held(str(path), open_lock(path)):
                order.append("second")

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.2)
        order.append("first")
    thread.join(5)
    assert order == ["first", "second"]


def test_another_process_cannot_take_it_while_held(tmp_path):
    path = tmp_path / "layers.lock"
    probe = (
        "import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR)\n"
        "try:\n    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n    sys.exit(3)\n"
    )
    with lockf_held(str(path), open_lock(path)):
        assert subprocess.run([sys.executable, "-c", probe, str(path)]).returncode == 3
    assert subprocess.run([sys.executable, "-c", probe, str(path)]).returncode == 0
