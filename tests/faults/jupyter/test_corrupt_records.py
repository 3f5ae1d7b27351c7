"""A kernelspec edited to nonsense and a truncated job record, seen from the Jupyter server's
REST API and the ``%podman_hpc jobs`` magic: the others are listed, the broken one is named in
one line (the answer's ``problems``, a warning above the magic's table), and once the record
is whole again it is listed with the others."""

from __future__ import annotations

import json

import pytest

from jupyter_podman_hpc.slurm import Job, JobSpec
from tests.helpers.faults import one_line
from tests.helpers.hpc import STORE_VARS
from tests.helpers.magics_kernel import start_session
from tests.helpers.server_extension import jobs_server_config

pytestmark = [pytest.mark.faults, pytest.mark.integration]


@pytest.fixture
def store(hpc, stack, monkeypatch):
    """The test storage with the tiny image squashed, as the in-process server's environment."""
    hpc("pull", stack.tiny_image)
    hpc.wipe_local_storage()
    for key in STORE_VARS:
        monkeypatch.setenv(key, hpc.env[key])
    return hpc


@pytest.fixture
def jp_server_config(jp_root_dir, jobs_root):
    return jobs_server_config(jobs_root)


@pytest.fixture
def two_jobs(store, stack, jobs_root):
    """Two finished jobs; the second's record truncated. (good job, broken record, its bytes)."""
    env = {key: store.env[key] for key in STORE_VARS}
    jobs = [
        Job.submit(
            JobSpec(image=stack.tiny_image, command=["true"], nodes=1, environment=env, job_name=f"faults-{word}"),
            jobs_root,
        )
        for word in ("whole", "truncated")
    ]
    for job in jobs:
        assert job.wait(timeout=300, poll_interval=0.5).state == "COMPLETED"
    record = jobs[1].directory / "job.json"
    whole = record.read_bytes()
    with open(record, "r+b") as out:
        out.truncate(len(whole) // 2)  # a write that stopped half-way (a full disk, a node lost)
    return jobs[0], record, whole


async def test_rest_lists_the_other_kernelspecs_and_names_the_broken_one(api, stack, jp_data_dir, jp_fetch):
    for name in ("good", "edited"):
        status, _ = await api("POST", "kernels", body={"image": stack.tiny_image, "name": name})
        assert status == 201
    spec = jp_data_dir / "kernels" / "edited" / "kernel.json"
    spec.write_text('{"argv": ["python3", "-m", "ipykernel_launcher"')  # edited by hand, saved half-way

    status, body = await api("GET", "kernels")
    assert status == 200 and [k["name"] for k in body["kernels"]] == ["good"]
    assert one_line("\n".join(body["problems"])) == (
        f"kernelspec {spec} is not valid JSON (line 1, column 48): fix or remove it"
    )
    # Jupyter's own listing (the launcher's) still answers, with the good one
    response = await jp_fetch("api", "kernelspecs", method="GET")
    specs = json.loads(response.body)["kernelspecs"]
    assert "good" in specs and "edited" not in specs

    status, _ = await api("POST", "kernels", body={"image": stack.tiny_image, "name": "edited"})
    assert status == 201
    status, body = await api("GET", "kernels")
    assert [k["name"] for k in body["kernels"]] == ["edited", "good"] and body["problems"] == []


async def test_rest_lists_the_other_jobs_and_names_the_truncated_record(api, two_jobs):
    good, record, whole = two_jobs
    status, body = await api("GET", "jobs")
    assert status == 200
    assert [job["id"] for job in body["jobs"]] == [good.id]
    line = one_line("\n".join(body["problems"]))
    assert line.startswith(f"job record {record} is not valid JSON (line "), line

    record.write_bytes(whole)
    status, body = await api("GET", "jobs")
    assert len(body["jobs"]) == 2 and body["problems"] == []


def test_the_jobs_magic_lists_the_other_jobs_and_names_the_truncated_record(store, two_jobs, tmp_path):
    good, record, whole = two_jobs
    kernel = start_session(store, tmp_path / "kernel")
    try:
        cell = kernel.execute("%podman_hpc jobs")
        assert cell.ok, cell.show()
        text = cell.result["text/plain"]
        warning, header, *rows = text.splitlines()
        assert warning.startswith(f"warning: job record {record} is not valid JSON (line "), text
        assert header.split()[:2] == ["JOB", "ID"] and [row.split()[0] for row in rows] == [good.id], text
        assert f"warning: job record {record}" in cell.result["text/html"]

        record.write_bytes(whole)
        cell = kernel.execute("%podman_hpc jobs")
        assert len(cell.result["text/plain"].splitlines()) == 3 and "warning" not in cell.result["text/plain"]
    finally:
        kernel.close()
