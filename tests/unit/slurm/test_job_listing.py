"""Listing jobs when a job record is damaged: the others are listed, the damaged one is one line."""

import os

import pytest

from jupyter_podman_hpc.slurm.jobs import Job, JobError, JobRecord
from tests.helpers.slurm_standin import StandInSlurm, submit


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda text: text[: len(text) // 2], "is not valid JSON (line "),
        (lambda text: "", "is not valid JSON (line 1, column 1)"),
        (lambda text: '{"id": "x", "spec": "nonsense", "submitted": "now"}', "has a malformed spec or run"),
        (
            lambda text: text.replace('"script": "job.sh"', '"script": "/home/u/.ssh/id_ed25519"'),
            "names a script that is not a file of its directory",
        ),
    ],
)
def test_a_damaged_record_is_one_problem_and_the_other_jobs_are_listed(tmp_path, damage, why):
    client = StandInSlurm(states=("COMPLETED",))
    whole, damaged = submit(tmp_path, client=client), submit(tmp_path, client=client)
    record = damaged.directory / "job.json"
    text = record.read_text()
    record.write_text(damage(text))
    problems = []
    assert [job.id for job in Job.list(tmp_path / "jobs", client=client, problems=problems)] == [whole.id]
    assert len(problems) == 1 and problems[0].startswith(f"job record {record} ") and why in problems[0], problems
    with pytest.raises(JobError) as refused:
        JobRecord.read(record)
    assert str(refused.value) == problems[0]
    record.write_text(text)  # the record whole again
    assert len(Job.list(tmp_path / "jobs", client=client, problems=problems)) == 2 and len(problems) == 1


def test_a_record_an_image_replaced_with_a_fifo_or_a_link_is_one_problem_not_a_hang(tmp_path):
    client = StandInSlurm(states=("COMPLETED",))
    whole, fifo, link = (submit(tmp_path, client=client) for _ in range(3))
    (fifo.directory / "job.json").unlink()
    os.mkfifo(fifo.directory / "job.json")
    (link.directory / "job.json").unlink()
    (link.directory / "job.json").symlink_to(whole.directory / "job.json")
    problems = []
    assert [job.id for job in Job.list(tmp_path / "jobs", client=client, problems=problems)] == [whole.id]
    assert problems == [
        f"cannot read the job record {link.directory / 'job.json'}: job.json is a symbolic link: "
        "not read: its job is not listed"
    ]  # the FIFO is no record: not a job directory
