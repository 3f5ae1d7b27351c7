"""Slurm from inside a container kernel (the `slurm` site module, on by default):
`srun -N2` and a 2-node `sbatch` from a cell against the stack's cluster, the
job's output at the same path inside and out; a kernelspec that opts out has
no Slurm."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from tests.conftest import run as run_command

from .test_provisioner import run, start

pytestmark = pytest.mark.slow


@pytest.fixture
def shared_cwd(stack):
    """A working directory every node sees (the nodes have private /tmp directories)."""
    path = stack.work_dir("kernel-slurm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_srun_and_sbatch_from_a_container_kernel(kernel_site, stack, shared_cwd):
    kernel_site.install(stack.base_image, "slurm-in")
    km, kc, _ = start("slurm-in", cwd=str(shared_cwd))
    job_id = ""
    try:
        reply, out = run(kc, textwrap.dedent("""\
            import subprocess
            step = subprocess.run(["srun", "-N2", "sh", "-c", "echo node=$SLURMD_NODENAME"],
                                  capture_output=True, text=True, timeout=120)
            print(step.returncode, step.stdout, step.stderr)
            """), timeout=150)
        assert reply["status"] == "ok", reply
        nodes = {line.split("=", 1)[1] for line in out.split() if line.startswith("node=")}
        assert out.startswith("0 ") and len(nodes) == 2 and nodes <= set(stack.nodes), out

        reply, out = run(kc, textwrap.dedent("""\
            import os, pathlib, subprocess
            pathlib.Path("job.sh").write_text("#!/bin/sh\\nsrun sh -c 'echo ran on $SLURMD_NODENAME'\\n")
            submitted = subprocess.run(["sbatch", "--parsable", "-N2", "-o", "job.out", "job.sh"],
                                       capture_output=True, text=True, timeout=60)
            print("id", submitted.stdout.strip().split(";")[0], submitted.stderr.strip())
            """), timeout=90)
        assert reply["status"] == "ok", reply
        job_id = out.split()[1]
        assert job_id.isdigit(), out
        reply, out = run(kc, textwrap.dedent(f"""\
            import subprocess, time
            for _ in range(240):
                state = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State,ExitCode", "-j", "{job_id}"],
                                       capture_output=True, text=True).stdout.strip()
                if state.startswith(("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")):
                    break
                time.sleep(0.5)
            print("state", state)
            print(open("job.out").read())
            """), timeout=150)
        assert reply["status"] == "ok", reply
        assert "state COMPLETED|0:0" in out, out
        assert out.count("ran on n") == 2, out
        # the same file on the host: output paths are the same inside and out
        assert (shared_cwd / "job.out").read_text().count("ran on n") == 2
        job_id = ""
    finally:
        if job_id:  # only the job this test submitted
            run_command(["scancel", job_id], check=False)
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_a_kernelspec_can_opt_out_of_slurm(kernel_site, stack):
    kernel_site.install(stack.base_image, "slurm-out", slurm=False)
    km, kc, _ = start("slurm-out")
    try:
        reply, out = run(kc, "import shutil; print('srun:', shutil.which('srun'))")
        assert reply["status"] == "ok" and "srun: None" in out, out
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
