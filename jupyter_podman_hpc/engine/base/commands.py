"""Running external commands, each logged with its exit code and duration.

Every program the engine starts (podman, squashfuse, mksquashfs, unsquashfs,
Slurm's commands...) goes through ``run``, ``popen`` or ``become`` here, which log
its argv at debug level to the ``jupyter_podman_hpc`` logger (``LOGGER``).
Command lines are built elsewhere (``podman.Podman`` for podman,
``slurm.client.SlurmClient`` for Slurm); this is only the runner.

Who shows the log: ``podman-hpc --log-level debug`` (stderr), the server
extension (the Jupyter server's log: ``--log-level=DEBUG``), the magics
(``%podman_hpc --debug ...``); a library user configures ``logging``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TextIO

LOGGER = "jupyter_podman_hpc"


def _logger():
    # A rank's `podman-hpc shared-run` does not import logging (10 ms): if nothing
    # imported it, nothing can have asked for a log either.
    logging = sys.modules.get("logging")
    if logging is None:
        return None
    log = logging.getLogger(LOGGER)
    return log if log.isEnabledFor(logging.DEBUG) else None


def _log(argv: Sequence[str], outcome: str, started: float | None = None) -> None:
    log = _logger()
    if log is not None:
        took = "" if started is None else f" after {time.monotonic() - started:.3f} s"
        log.debug("%s: %s%s", shlex.join(map(str, argv)), outcome, took)


def log(argv: Sequence[str], outcome: str) -> None:
    """Log a command started without this module's runners: a task's own fork and exec
    (``stepsocket.exec_and_wait``), which must work where nothing imported subprocess."""
    _log(argv, outcome)


def run(argv: Sequence[str], **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run``, logged."""
    started = time.monotonic()
    try:
        result = subprocess.run(list(argv), **kwargs)
    except FileNotFoundError:
        _log(argv, "not found", started)
        raise
    except subprocess.TimeoutExpired:
        _log(argv, "timed out", started)
        raise
    _log(argv, f"exit {result.returncode}", started)
    return result


class Process(subprocess.Popen):
    """``subprocess.Popen`` that logs its start and, once seen by wait/poll, its exit."""

    def __init__(self, argv: Sequence[str], **kwargs):
        self._started = time.monotonic()
        self._argv = list(argv)
        try:
            super().__init__(self._argv, **kwargs)
        except FileNotFoundError:
            _log(self._argv, "not found", self._started)
            raise
        self._logged = False
        _log(self._argv, f"started (pid {self.pid})")

    def _note_exit(self) -> None:
        if self.returncode is not None and not self._logged:
            self._logged = True
            _log(self._argv, f"exit {self.returncode}", self._started)

    def wait(self, timeout: float | None = None) -> int:
        """``Popen.wait``, and the exit logged (once) when the process has ended."""
        code = super().wait(timeout)
        self._note_exit()
        return code

    def poll(self) -> int | None:
        """``Popen.poll``, and the exit logged (once) when the process has ended."""
        code = super().poll()
        self._note_exit()
        return code


def popen(argv: Sequence[str], **kwargs) -> Process:
    """``subprocess.Popen``, logged."""
    return Process(argv, **kwargs)


def become(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Become the command (``os.execvpe``); logged before, since nothing runs after."""
    _log(argv, "exec")
    os.execvpe(argv[0], list(argv), env)


@contextmanager
def logged_to(stream: TextIO, level: str = "debug") -> Iterator[None]:
    """Show the engine's log on ``stream`` while the block runs (the magics' --debug)."""
    import logging

    log = logging.getLogger(LOGGER)
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("podman-hpc: %(message)s"))
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(level.upper())
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


PODMAN_LEVELS = {
    "trace": "DEBUG",
    "debug": "DEBUG",
    "info": "INFO",
    "warn": "WARNING",
    "warning": "WARNING",
    "error": "ERROR",
    "fatal": "CRITICAL",
    "panic": "CRITICAL",
}


def log_to_stderr(podman_level: str) -> None:
    """The CLI's ``--log-level``: podman's level names, our log on stderr (debug and info only,
    the levels at which the engine logs)."""
    level = PODMAN_LEVELS.get(podman_level.lower(), "")
    if level not in ("DEBUG", "INFO"):
        return
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("podman-hpc %(levelname)s: %(message)s"))
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    log.setLevel(level)
