"""The in-container boot program: a pooled kernel's start request, and the %load_ext guard
(in containers: tests/integration/kernels/test_pool.py and test_magics_inside.py)."""

from __future__ import annotations

import io
import json
import os

import pytest

from jupyter_podman_hpc.kernels import boot


def test_a_start_request_sets_the_connection_file_cwd_and_env(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("STALE", "1")
    work = tmp_path / "notebooks"
    work.mkdir()
    path = tmp_path / "runtime" / "kernel-1.json"  # not shared with the container: a private copy
    info = {"shell_port": 1, "key": "k", "transport": "tcp", "ip": "127.0.0.1"}
    request = {
        "connection_file": str(path),
        "connection_info": info,
        "cwd": str(work),
        "env": {"JPY_SESSION_NAME": "nb.ipynb"},
        "unset": ["STALE"],
        "argv": ["-f", str(path)],
    }
    monkeypatch.setenv("JPY_SESSION_NAME", "before")
    argv = boot.receive(io.StringIO(json.dumps(request) + "\n"))
    assert argv == ["-f", str(path)]
    assert json.loads(path.read_text()) == info and (path.stat().st_mode & 0o777) == 0o600
    assert os.getcwd() == str(work)
    assert os.environ["JPY_SESSION_NAME"] == "nb.ipynb" and "STALE" not in os.environ


def test_a_shared_connection_file_is_used_as_it_is(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "kernel-2.json"
    path.write_text('{"key": "from the host"}')
    request = {
        "connection_file": str(path),
        "connection_info": {"key": "other"},
        "cwd": str(tmp_path),
        "argv": ["-f", str(path)],
    }
    boot.receive(io.StringIO(json.dumps(request) + "\n"))
    assert json.loads(path.read_text()) == {"key": "from the host"}


def test_an_unused_pooled_kernel_exits_quietly():
    with pytest.raises(SystemExit) as ended:
        boot.receive(io.StringIO(""))
    assert ended.value.code == 0


def test_load_ext_of_a_missing_package_is_one_line(monkeypatch, capsys):
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    monkeypatch.setattr(boot, "EXTENSION", "jph_absent_package")
    boot.guard_load_ext(shell)
    shell.run_line_magic("load_ext", "jph_absent_package")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no module named 'jph_absent_package'" in err
    assert "install jupyter-podman-hpc in the image" in err
    with pytest.raises(ModuleNotFoundError):  # other extensions: IPython's own behaviour
        shell.run_line_magic("load_ext", "jph_other_absent_package")


class FakeApp:
    """What keep_connection_file needs of ipykernel's IPKernelApp: the file, and the write it wraps."""

    def __init__(self, path):
        self.abs_connection_file = str(path)
        self.written = 0

    def write_connection_file(self):
        self.written += 1


def test_a_connection_file_naming_every_port_is_not_rewritten(tmp_path):
    # the host's file, which jupyter_client reads again as the kernel binds its ports
    path = tmp_path / "kernel-1.json"
    info = {port: 50000 + i for i, port in enumerate(boot.PORTS)} | {"key": "k", "transport": "tcp"}
    path.write_text(json.dumps(info))
    app_class = type("App", (FakeApp,), {})
    boot.keep_connection_file(app_class)
    app = app_class(path)
    app.write_connection_file()
    assert app.written == 0 and json.loads(path.read_text()) == info


@pytest.mark.parametrize("content", ["", "[]", json.dumps({"shell_port": 0, "iopub_port": 1})])
def test_a_connection_file_without_every_port_is_written_by_ipykernel(tmp_path, content):
    path = tmp_path / "kernel-2.json"
    path.write_text(content)
    app_class = type("App", (FakeApp,), {})
    boot.keep_connection_file(app_class)
    app = app_class(path)
    app.write_connection_file()
    assert app.written == 1
    missing = app_class(tmp_path / "missing.json")
    missing.write_connection_file()
    assert missing.written == 1
