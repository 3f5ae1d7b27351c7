"""Job directories: what submit writes, what a refused submission leaves (nothing), finding
jobs again from disk, wait and logs. Slurm is a stand-in here; tests/integration/slurm has the
real one."""

import json
import os
import stat

import nbformat
import pytest

from jupyter_podman_hpc.engine.errors import ImageNotFound
from jupyter_podman_hpc.engine.progress import Progress
from jupyter_podman_hpc.engine.site.config import SiteConfig
from jupyter_podman_hpc.slurm import jobs
from jupyter_podman_hpc.slurm.client import JobStatus, SlurmError
from jupyter_podman_hpc.slurm.jobs import Job, JobError, JobNotFound, JobTimeout, default_root
from jupyter_podman_hpc.slurm.spec import JobSpec, JobSpecError
from tests.helpers.slurm_standin import IMAGE, StandInSlurm, squashed_config, submit


def test_an_image_that_is_not_squashed_is_refused(tmp_path):
    spec = JobSpec(image="registry.example.org:5000/team/other:1.0", command=["true"])
    with pytest.raises(ImageNotFound, match="not in the squashed store"):
        Job.submit(spec, tmp_path / "jobs", client=StandInSlurm(), config=squashed_config(tmp_path))
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_submit_writes_a_complete_job_directory(tmp_path):
    events = []
    client = StandInSlurm()
    job = submit(tmp_path, client=client, progress=events.append)
    assert job.id == "101"
    assert client.submitted == [(str(job.directory / "job.sh"), str(job.directory))]
    assert sorted(p.name for p in job.directory.iterdir()) == ["job.json", "job.sh", "out"]
    assert job.directory.parent == tmp_path / "jobs" and not job.directory.name.startswith(".")
    record = json.loads((job.directory / "job.json").read_text())
    assert record["job_id"] == "101" and record["spec"]["command"] == ["echo", "hi"]
    assert record["run"] == {"kind": "command", "argv": ["echo", "hi"], "out": "out"} and record["submitted"]
    assert job.script.startswith("#!/bin/bash\n") and f"--chdir={job.directory}" in job.script
    assert (job.directory / "job.sh").stat().st_mode & 0o111
    assert job.spec == JobSpec(image=IMAGE, command=["echo", "hi"], nodes=2, tasks_per_node=2)
    assert [e.stage for e in events] == ["job", "job"] and events[-1].message == "submitted job 101"
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == [job.directory.name]  # no temporaries


@pytest.fixture
def open_umask():
    """A umask that would leave everything readable and writable by everyone."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_only_the_user_can_read_a_job_whatever_the_umask(tmp_path, open_umask):
    job = submit(tmp_path, spec=JobSpec(image=IMAGE, command=["true"], environment={"TOKEN": "s3cret"}))
    assert "s3cret" in (job.directory / "job.json").read_text()
    modes = {
        p.name: stat.S_IMODE(p.stat().st_mode)
        for p in (
            tmp_path / "jobs",
            job.directory,
            job.directory / "out",
            job.directory / "job.json",
            job.directory / "job.sh",
        )
    }
    assert modes == {"jobs": 0o700, job.directory.name: 0o700, "out": 0o700, "job.json": 0o600, "job.sh": 0o700}


def test_a_job_directory_an_older_version_left_readable_still_works(tmp_path):
    job = submit(tmp_path)
    job.directory.chmod(0o755)
    (job.directory / "job.json").chmod(0o644)
    (job.directory / "slurm-101.out").write_text("")
    found = Job.list(tmp_path / "jobs", client=StandInSlurm(states=("COMPLETED",)))
    assert [j.id for j in found] == ["101"] and found[0].status().state == "COMPLETED"
    assert stat.S_IMODE((job.directory / "job.json").stat().st_mode) == 0o600  # rewritten with the status


def test_a_refused_submission_leaves_nothing_behind(tmp_path):
    client = StandInSlurm(refuse="sbatch: Batch job submission failed: Invalid partition name specified")
    with pytest.raises(SlurmError, match="Invalid partition name"):
        submit(tmp_path, client=client)
    assert list((tmp_path / "jobs").iterdir()) == []


def test_a_bad_input_leaves_nothing_behind(tmp_path):
    spec = JobSpec(image=IMAGE, python_script=str(tmp_path / "missing.py"))
    with pytest.raises(JobSpecError, match=r"python_script .* does not exist"):
        submit(tmp_path, spec)
    assert list((tmp_path / "jobs").iterdir()) == []
    spec = JobSpec(image=IMAGE, command=["true"], modules=["openmpi-pmix", "openmpi-pmi2"])
    with pytest.raises(JobSpecError, match="conflicts"):
        submit(tmp_path, spec)


def test_a_python_script_is_copied_and_run_from_the_job_directory(tmp_path):
    (tmp_path / "train.py").write_text("print('training')\n")
    job = submit(tmp_path, JobSpec(image=IMAGE, python_script=str(tmp_path / "train.py"), args=["-n", "2"]))
    assert (job.directory / "train.py").read_text() == "print('training')\n"
    assert job.script.rstrip().endswith(f"python3 -u {job.directory}/train.py -n 2")
    assert job.record.run["inputs"] == ["train.py"]


def test_a_notebook_goes_into_the_job_directory_with_its_runner(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("n = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("%time x = n"),
    ]
    nbformat.write(notebook, str(tmp_path / "Study.ipynb"))
    spec = JobSpec(image=IMAGE, notebook=str(tmp_path / "Study.ipynb"), parameters={"n": "2"})
    job = submit(tmp_path, spec)
    assert {p.name for p in job.directory.iterdir()} == {
        "Study.ipynb",
        "nbrunner.py",
        "nbcells.py",
        "nbrecorder.py",
        "nbrun",
        "out",
        "job.sh",
        "job.json",
    }
    assert {p.name for p in (job.directory / "out").iterdir()} == {"nbrun"}
    assert f"python3 -u {job.directory}/nbrunner.py {job.directory}/nbrun/plan.json" in job.script
    assert (
        "# Notebook Study.ipynb run cell by cell by nbrunner.py on every rank, under IPython (it uses "
        "magics); rank 0 writes out/Study.out.ipynb."
    ) in job.script
    run = job.record.run
    assert (run["out"], run["output"], run["ipython"], run["parameters"]) == (
        "out",
        "Study.out.ipynb",
        "require",
        {"n": "2"},
    )
    assert run["magics"] and run["inputs"] == ["Study.ipynb", "nbrunner.py", "nbcells.py", "nbrecorder.py"]
    assert job.record.spec["parameters"] == {"n": "2"}
    assert nbformat.read(str(job.directory / "Study.ipynb"), as_version=4).cells[1].source.endswith("n = 2")
    output = job.as_dict()["output"]
    assert (output["name"], output["exists"], output["path"]) == (
        "Study.out.ipynb",
        False,
        str(job.directory / "out" / "Study.out.ipynb"),
    )
    assert submit(tmp_path, JobSpec(image=IMAGE, command=["true"])).as_dict()["output"] is None
    preview = Job.preview(spec, tmp_path / "jobs", config=SiteConfig())
    assert preview.replace(preview.split("--chdir=")[1].split("\n")[0], "D") == job.script.replace(
        str(job.directory), "D"
    )


def test_jobs_are_found_again_from_their_directories(tmp_path):
    submitter = StandInSlurm()
    first, second = submit(tmp_path, client=submitter), submit(tmp_path, client=submitter)
    client = StandInSlurm(states=("COMPLETED",))
    jobs = Job.list(tmp_path / "jobs", client=client)
    assert [(j.id, j.directory) for j in jobs] == [("101", first.directory), ("102", second.directory)]
    assert all(j.status(refresh=False).state == "COMPLETED" for j in jobs)
    again = Job.list(tmp_path / "jobs", client=client)  # finished: read from the records, not Slurm
    assert client.asked == 1 and all(j.status().source == "record" for j in again)
    found = Job.find(102, tmp_path / "jobs", client=client)
    assert found.directory == second.directory and found.spec == second.spec
    with pytest.raises(JobNotFound, match="no job 999 in"):
        Job.find(999, tmp_path / "jobs", client=client)


def test_find_takes_the_latest_of_a_reused_id_and_skips_foreign_directories(tmp_path):
    client = StandInSlurm()
    first = submit(tmp_path, client=client)
    client.submitted.clear()  # Slurm restarted with a fresh state: the id comes again
    second = submit(tmp_path, client=client)
    assert first.id == second.id
    (tmp_path / "jobs" / "not-a-job").mkdir()
    (tmp_path / "jobs" / ".20260101-000000-abcdef.tmp").mkdir()
    (tmp_path / "jobs" / "garbage").mkdir()
    (tmp_path / "jobs" / "garbage" / "job.json").write_text("[1, 2]")
    assert Job.find(first.id, tmp_path / "jobs", client=client).directory == second.directory
    assert len(Job.list(tmp_path / "jobs", client=client, status=False)) == 2


def test_a_record_without_job_id_is_recovered_from_slurm_s_log(tmp_path):
    job = submit(tmp_path)
    record = json.loads((job.directory / "job.json").read_text())
    record["job_id"] = None  # as if the submitter died between sbatch and the record
    (job.directory / "job.json").write_text(json.dumps(record))
    assert Job.list(tmp_path / "jobs", status=False) == []
    (job.directory / "slurm-4711.out").write_text("")
    (recovered,) = Job.list(tmp_path / "jobs", status=False)
    assert recovered.id == "4711"
    assert json.loads((job.directory / "job.json").read_text())["job_id"] == "4711"


def test_wait_reports_each_change_and_returns_the_final_status(tmp_path):
    client = StandInSlurm(states=("PENDING", "PENDING", "RUNNING", "RUNNING", "COMPLETED"))
    job = submit(tmp_path, client=client)
    events: list[Progress] = []
    status = job.wait(timeout=30, poll_interval=0.01, progress=events.append)
    assert status.state == "COMPLETED" and status.exit_code == 0
    assert [e.message for e in events] == [
        "job 101 PENDING",
        "job 101 RUNNING on n[1-2]",
        "job 101 COMPLETED on n[1-2]",
    ]
    assert {e.stage for e in events} == {"job"} and events[-1].fraction == 1.0
    assert json.loads((job.directory / "job.json").read_text())["final"]["state"] == "COMPLETED"


def test_wait_gives_up_after_its_timeout(tmp_path):
    job = submit(tmp_path, client=StandInSlurm(states=("RUNNING",)))
    with pytest.raises(JobTimeout, match=r"job 101 is still RUNNING after 0\.3 s") as caught:
        job.wait(timeout=0.3, poll_interval=0.05)
    assert caught.value.status.state == "RUNNING"
    job.cancel()
    assert job.client.cancelled == ["101"]


def test_logs_are_per_rank_and_labelled(tmp_path):
    job = submit(tmp_path)
    for rank in (0, 1, 10):
        (job.directory / f"rank-{rank}.out").write_text(f"hello from {rank}\nbye\n")
        (job.directory / f"rank-{rank}.err").write_text("" if rank else "warning\n")
    (job.directory / f"slurm-{job.id}.out").write_text("srun: error: n1: task 0: Exited with exit code 3\n")
    assert job.logs() == {0: "hello from 0\nbye\n", 1: "hello from 1\nbye\n", 10: "hello from 10\nbye\n"}
    assert job.logs("err") == {0: "warning\n", 1: "", 10: ""}
    assert job.labelled_output().splitlines()[:3] == ["0: hello from 0", "0: bye", "1: hello from 1"]
    assert "task 0: Exited with exit code 3" in job.batch_log()
    with pytest.raises(JobError, match="stream must be"):
        job.logs("both")


def test_logs_an_image_planted_are_one_line_each_and_a_long_one_keeps_its_end(tmp_path, monkeypatch):
    job = submit(tmp_path)
    (job.directory / "rank-0.out").symlink_to("/dev/zero")
    os.mkfifo(job.directory / "rank-1.out")
    (job.directory / "rank-2.out").write_text("x" * 100 + "\nlast line\n")
    (job.directory / f"slurm-{job.id}.out").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setattr(jobs, "LOG_LIMIT", 10)
    assert job.logs() == {
        0: "rank-0.out is a symbolic link: not read\n",
        1: "rank-1.out is not a regular file: not read\n",
        2: "[... cut: rank-2.out is 111 B, its last 10 B follow]\nlast line\n",
    }
    assert job.batch_log() == f"slurm-{job.id}.out is a symbolic link: not read\n"


def test_the_default_root_is_on_scratch():
    assert str(default_root({"SCRATCH": "/scratch/u"})) == "/scratch/u/podman-hpc/jobs"
    with pytest.raises(JobError, match="SCRATCH is not set"):
        default_root({})


def test_an_end_known_without_its_exit_code_is_not_recorded_as_final(tmp_path):
    class LaggingSlurm(StandInSlurm):
        """squeue knows the end; neither slurmdbd nor slurmctld gave the exit code yet."""

        def statuses(self, job_ids):
            return {j: JobStatus(j, "COMPLETED", raw_state="COMPLETED", source="squeue") for j in job_ids}

    job = submit(tmp_path, client=LaggingSlurm())
    assert job.status().state == "COMPLETED"
    assert json.loads((job.directory / "job.json").read_text())["final"] is None
    job.client = StandInSlurm(states=("COMPLETED",))
    assert job.status().exit_code == 0
    assert json.loads((job.directory / "job.json").read_text())["final"]["exit_code"] == 0
