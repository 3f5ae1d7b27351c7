"""The one runner of external commands logs each with its exit code and duration."""

import io
import logging
import subprocess
import sys

import pytest

from jupyter_podman_hpc.engine.base import commands


@pytest.fixture
def debug_log(caplog):
    caplog.set_level(logging.DEBUG, logger=commands.LOGGER)
    return caplog


def test_run_logs_the_argv_its_exit_code_and_duration(debug_log):
    commands.run([sys.executable, "-c", "raise SystemExit(3)"], capture_output=True)
    (line,) = [r.getMessage() for r in debug_log.records]
    assert line.startswith(f"{sys.executable} -c 'raise SystemExit(3)': exit 3 after ") and line.endswith(" s")


def test_popen_logs_its_start_and_its_exit_once(debug_log):
    process = commands.popen([sys.executable, "-c", "pass"])
    process.wait()
    process.poll()
    lines = [r.getMessage() for r in debug_log.records]
    assert len(lines) == 2 and f"started (pid {process.pid})" in lines[0] and ": exit 0 after " in lines[1]


def test_a_missing_program_is_logged_and_raised(debug_log):
    with pytest.raises(FileNotFoundError):
        commands.run(["/nonexistent/podman", "ps"])
    with pytest.raises(subprocess.TimeoutExpired):
        commands.run([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.2)
    lines = [r.getMessage() for r in debug_log.records]
    assert lines[0].startswith("/nonexistent/podman ps: not found") and "timed out" in lines[1]


def test_the_magics_switch_shows_the_log_on_a_stream_for_one_block():
    stream = io.StringIO()
    with commands.logged_to(stream):
        commands.run(["true"])
    commands.run(["false"])
    assert stream.getvalue() == stream.getvalue().splitlines()[0] + "\n"
    assert stream.getvalue().startswith("podman-hpc: true: exit 0 after ")


def test_the_cli_log_level_takes_podman_names(monkeypatch):
    logger = logging.getLogger(commands.LOGGER)
    monkeypatch.setattr(logger, "handlers", [])
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    commands.log_to_stderr("error")  # podman-hpc's default: the engine's log stays off
    assert logger.handlers == []
    commands.log_to_stderr("debug")
    assert logger.level == logging.DEBUG and len(logger.handlers) == 1
