"""Batch-script rendering: the exact script for a typical spec, and quoting that survives bash."""

import json
import os
import shlex
import subprocess
import sys

import pytest

from jupyter_podman_hpc.engine.site.config import SITE_DATA, SiteConfig
from jupyter_podman_hpc.engine.site.modules import ModuleSet
from jupyter_podman_hpc.slurm.script import RunTarget, render
from jupyter_podman_hpc.slurm.spec import JobSpec, JobSpecError

IMAGE = "registry.example.org:5000/team/image:1.0"
JOB_DIR = "/scratch/user/podman-hpc/jobs/20260101-000000-abcdef"
SITE_MODULES = ModuleSet.load(str(SITE_DATA / "modules.d"))
HOSTILE = 'a\'b; rm -rf / $(touch pwned) `touch pwned2` "q" \\ *'


def rendered(spec, job_dir=JOB_DIR, **kwargs):
    kwargs.setdefault("modules", SITE_MODULES)
    kwargs.setdefault("config", SiteConfig())
    kwargs.setdefault("bin_dir", "/opt/venv/bin")
    return render(spec, job_dir, **kwargs)


def test_the_script_of_a_typical_mpi_job_line_by_line():
    spec = JobSpec(
        image=IMAGE,
        command=["python3", "allreduce.py"],
        nodes=4,
        tasks_per_node=2,
        cpus_per_task=4,
        gpus_per_node=1,
        time="00:30:00",
        partition="debug",
        account="m1234",
        qos="regular",
        reservation="maint",
        modules=["openmpi-pmix"],
        job_name="allreduce",
        environment={"OMPI_MCA_btl": "self,tcp", "GREETING": "hello world"},
        extra_directives=["--mail-type=END,FAIL", "--exclusive"],
    )
    D = JOB_DIR
    assert rendered(spec).splitlines() == [
        "#!/bin/bash",
        "#SBATCH --job-name=allreduce",
        "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --gpus-per-node=1",
        "#SBATCH --time=00:30:00",
        "#SBATCH --partition=debug",
        "#SBATCH --account=m1234",
        "#SBATCH --qos=regular",
        "#SBATCH --reservation=maint",
        f"#SBATCH --chdir={D}",
        f"#SBATCH --output={D}/slurm-%j.out",
        "#SBATCH --mail-type=END,FAIL",
        "#SBATCH --exclusive",
        "",
        "# Written by jupyter-podman-hpc 0.1.0: 4 node(s) x 2 task(s), podman-exec mode. "
        f"Submit it again with: sbatch {D}/job.sh",
        f"# Every rank sees this directory read-only and may write only {D}/out/, its working directory.",
        "",
        "# podman-hpc of the Python environment that wrote this script, first on PATH: sbatch",
        "# passes the submitter's environment to the job, but a shell (or a Jupyter server)",
        "# without that environment on its PATH may submit this script too, and every node",
        "# then runs the same podman-hpc as the login node.",
        'export PATH=/opt/venv/bin:"$PATH"',
        "",
        "# The job's environment: seen by podman-hpc on the nodes and passed into the containers.",
        "export OMPI_MCA_btl=self,tcp",
        "export GREETING='hello world'",
        "",
        f"srun --mpi=pmix --cpus-per-task=4 --output={D}/rank-%t.out --error={D}/rank-%t.err \\",
        f"    podman-hpc shared-run --openmpi-pmix -e OMPI_MCA_btl -e GREETING -v {D}:{D}:ro -v {D}/out:{D}/out "
        f"-w {D}/out \\",
        f"    {IMAGE} python3 allreduce.py",
    ]


def test_per_process_mode_runs_a_container_per_rank_with_the_rank_environment():
    spec = JobSpec(
        image=IMAGE, command=["hostname"], nodes=2, modules=["openmpi-pmi2"], mode="per-process", workdir="/work"
    )
    lines = rendered(spec).splitlines()
    assert lines[-3] == f"srun --mpi=pmi2 --output={JOB_DIR}/rank-%t.out --error={JOB_DIR}/rank-%t.err \\"
    assert lines[-2] == (
        "    podman-hpc run --rm --openmpi-pmi2 -e 'SLURM_*' -e 'SLURMD_*' -e 'PALS_*' "
        f"-e 'PMI_*' -e 'PMIX_*' -e 'OMPI_*' -v {JOB_DIR}:{JOB_DIR}:ro "
        f"-v {JOB_DIR}/out:{JOB_DIR}/out -w /work \\"
    )
    assert f"# Every rank sees this directory read-only and may write only {JOB_DIR}/out/, and works in /work." in lines
    assert lines[-1] == f"    {IMAGE} hostname"


def test_optional_lines_are_left_out():
    text = rendered(JobSpec(image=IMAGE, command=["true"]), bin_dir=None)
    assert "--time" not in text and "--partition" not in text and "--cpus-per-task" not in text
    assert "export" not in text and "--mpi" not in text
    assert "#SBATCH --job-name=true\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n" in text


def test_script_and_notebook_targets_run_from_the_job_directory():
    script = rendered(JobSpec(image=IMAGE, python_script="/home/u/train.py", args=["--epochs", "3"]))
    assert script.splitlines()[-1] == f"    {IMAGE} python3 -u {JOB_DIR}/train.py --epochs 3"
    notebook = rendered(JobSpec(image=IMAGE, notebook="/home/u/Analysis.ipynb", args=["a b"]))
    plan = f"{JOB_DIR}/nbrun/plan.json"
    assert notebook.splitlines()[-6:] == [
        f"    {IMAGE} python3 -u {JOB_DIR}/nbrunner.py {plan} 'a b'",
        "status=$?",
        "# Every rank's end into the output notebook, by this package's runner (not the job",
        "# directory's copy, which the ranks ran): it reads what they wrote as data.",
        f'{shlex.quote(sys.executable)} -I -m jupyter_podman_hpc.slurm.nbrunner --finish {plan} "$status" || true',
        'exit "$status"',
    ]
    target = RunTarget(("python3", "run.py"), "notebook", "run by a runner")
    text = rendered(JobSpec(image=IMAGE, notebook="/home/u/a.ipynb"), target=target)
    assert "\n# run by a runner\n" in text
    assert text.splitlines()[-1] == f"    {IMAGE} python3 run.py"


def test_the_script_is_valid_bash_and_hostile_values_arrive_intact(tmp_path):
    """Run the script with bash, with a stand-in srun that records its argv and environment."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "record.json"
    (bin_dir / "srun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
    )
    (bin_dir / "srun").chmod(0o755)
    job_dir = str(tmp_path / "jobs" / "a'b $(x)")
    spec = JobSpec(
        image=IMAGE,
        command=["sh", "-c", HOSTILE, HOSTILE],
        environment={"HOSTILE": HOSTILE},
        workdir=f"/w/{HOSTILE}",
        job_name="x",
    )
    text = render(spec, job_dir, modules=SITE_MODULES, config=SiteConfig(), bin_dir=str(bin_dir))
    script = tmp_path / "job.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path, env={"PATH": os.defpath, "HOME": str(tmp_path)})
    seen = json.loads(record.read_text())
    assert seen["argv"] == [
        f"--output={job_dir}/rank-%t.out",
        f"--error={job_dir}/rank-%t.err",
        "podman-hpc",
        "shared-run",
        "-e",
        "HOSTILE",
        "-v",
        f"{job_dir}:{job_dir}:ro",
        "-v",
        f"{job_dir}/out:{job_dir}/out",
        "-w",
        f"/w/{HOSTILE}",
        IMAGE,
        "sh",
        "-c",
        HOSTILE,
        HOSTILE,
    ]
    assert seen["env"]["HOSTILE"] == HOSTILE
    assert seen["env"]["PATH"].startswith(f"{bin_dir}:")
    assert not (tmp_path / "pwned").exists() and not (tmp_path / "pwned2").exists()


@pytest.mark.parametrize(
    "job_dir, message",
    [
        ("relative/dir", "the job directory must be an absolute path"),
        ("/scratch/a\n#SBATCH --uid=0", "job directory must not contain a newline"),
    ],
)
def test_bad_job_directories_are_refused(job_dir, message):
    with pytest.raises(JobSpecError, match=message):
        rendered(JobSpec(image=IMAGE, command=["true"]), job_dir=job_dir)


def test_module_errors_surface_when_rendering():
    with pytest.raises(JobSpecError, match=r"^modules: module 'openmpi-pmix' .* conflicts with 'openmpi-pmi2'"):
        rendered(JobSpec(image=IMAGE, command=["true"], modules=["openmpi-pmix", "openmpi-pmi2"]))
    with pytest.raises(JobSpecError, match=r"^modules: unknown module 'gpus'"):
        rendered(JobSpec(image=IMAGE, command=["true"], modules=["gpus"]))


def test_a_target_with_a_newline_is_refused():
    target = RunTarget(("python3", "a\nb"))
    with pytest.raises(JobSpecError, match=r"^command must not contain a newline"):
        rendered(JobSpec(image=IMAGE, command=["true"]), target=target)
