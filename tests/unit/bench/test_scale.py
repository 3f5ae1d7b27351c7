"""The scale benchmark's configurations (bench/scale.py): podman-exec with its nodes in turn runs the same
command as podman-exec, each node's tasks starting TURN_SECONDS x its node index later, in a real shell."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import scale


def launch_table():
    srun = lambda n, k: ["srun", f"-N{n}", f"--ntasks-per-node={k}"]  # noqa: E731
    return {
        "bare": lambda n, k: ([*srun(n, k), "true"], {}),
        "podman-exec": lambda n, k: ([*srun(n, k), "podman-hpc", "shared-run", "img", "echo", "a b"], {"E": "1"}),
    }


def test_podman_exec_in_turn_runs_podman_exec_s_command_after_its_nodes_turn():
    table = scale.configurations(launch_table())
    assert list(table) == ["bare", "podman-exec", scale.IN_TURN]  # in CONFIGS' order, those the setup has
    argv, env = table[scale.IN_TURN](16, 8)
    assert argv[:3] == ["srun", "-N16", "--ntasks-per-node=8"] and env == {"E": "1"}
    started = time.monotonic()
    out = subprocess.run(
        argv[3:], env={"SLURM_NODEID": "1", "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=False
    )
    # the shell waited node 1's turn, then ran podman-exec's words unchanged (podman-hpc is not on PATH here)
    assert time.monotonic() - started >= scale.TURN_SECONDS
    assert "podman-hpc" in out.stderr and out.returncode == 127
    argv0, _ = table[scale.IN_TURN](1, 1)
    assert argv0[argv0.index("sh", 4) + 1 :] == ["podman-hpc", "shared-run", "img", "echo", "a b"]
