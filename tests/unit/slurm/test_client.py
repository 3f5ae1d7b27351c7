"""Reading Slurm's answers: squeue, sacct and sinfo samples, state normalization, host lists,
and how the client turns Slurm's failures into messages (with stand-in commands)."""

import pytest

from jupyter_podman_hpc.slurm.client import (
    JobStatus,
    SlurmClient,
    SlurmError,
    expand_nodelist,
    normalize_state,
    parse_sacct,
    parse_scontrol_exit_code,
    parse_sinfo,
    parse_squeue,
    submission_environment,
)

# squeue -h -t all -o '%i|%T|%N|%M|%S|%e|%r' (Slurm 22.05)
SQUEUE = """\
201|PENDING||0:00|N/A|N/A|Resources
202|PENDING||0:00|N/A|N/A|PartitionNodeLimit
203|RUNNING|n[1-4]|1:02|2026-11-30T20:39:04|Unknown|None
204|COMPLETING|n1|0:07|2026-11-30T20:39:04|2026-11-30T20:39:11|None
205|COMPLETED|n[1-2]|0:05|2026-11-30T20:39:04|2026-11-30T20:39:09|None
206|CONFIGURING|n3|0:00|2026-11-30T20:39:04|Unknown|None
"""

# sacct -X -n -P --format=JobID,State,ExitCode,NodeList,Elapsed,Start,End,Reason
SACCT = """\
95|FAILED|7:0|n[1-4]|00:00:06|2026-11-30T20:32:24|2026-11-30T20:32:30|None
100|CANCELLED by 1001|0:15|n[1-4]|00:00:02|2026-11-30T20:33:19|2026-11-30T20:33:21|None
103|COMPLETED|0:0|n1|00:00:00|2026-11-30T20:33:43|2026-11-30T20:33:43|None
110|TIMEOUT|0:0|n[1-4]|00:01:00|2026-11-30T21:00:00|2026-11-30T21:01:00|None
111|OUT_OF_MEMORY|0:125|n2|00:00:09|2026-11-30T21:00:00|2026-11-30T21:00:09|None
112|NODE_FAIL|0:0|n3|1-02:03:04|2026-11-29T21:00:00|2026-11-30T23:03:04|None
113|PENDING|0:0|None assigned|00:00:00|Unknown|Unknown|Priority
114|RUNNING|0:0|n[1-4]|00:00:12|2026-11-30T21:00:00|Unknown|None
115|PREEMPTED|0:0|n1|00:00:12|2026-11-30T21:00:00|2026-11-30T21:00:12|None
116|FAILED|1:0|n1|00:00:01|2026-11-30T21:00:00|2026-11-30T21:00:01|None
116|COMPLETED|0:0|n2|00:00:03|2026-11-30T21:01:00|2026-11-30T21:01:03|None
"""


@pytest.mark.parametrize(
    "raw, state, reason",
    [
        ("PENDING", "PENDING", ""),
        ("PD", "PENDING", ""),
        ("CONFIGURING", "PENDING", "nodes are being configured"),
        ("REQUEUED", "PENDING", "requeued"),
        ("RUNNING", "RUNNING", ""),
        ("COMPLETING", "RUNNING", "completing"),
        ("SUSPENDED", "RUNNING", "suspended"),
        ("COMPLETED", "COMPLETED", ""),
        ("CD", "COMPLETED", ""),
        ("FAILED", "FAILED", ""),
        ("OUT_OF_MEMORY", "FAILED", "out of memory"),
        ("OOM", "FAILED", "out of memory"),
        ("NODE_FAIL", "FAILED", "node failure"),
        ("BOOT_FAIL", "FAILED", "node boot failure"),
        ("CANCELLED", "CANCELLED", ""),
        ("CANCELLED by 1001", "CANCELLED", ""),
        ("CANCELLED+", "CANCELLED", ""),
        ("PREEMPTED", "CANCELLED", "preempted"),
        ("TIMEOUT", "TIMEOUT", ""),
        ("DEADLINE", "TIMEOUT", "deadline reached"),
        ("SOMETHING_NEW", "UNKNOWN", "something_new"),
    ],
)
def test_states_are_normalized(raw, state, reason):
    assert normalize_state(raw) == (state, reason)


def test_squeue_lines():
    found = parse_squeue(SQUEUE)
    assert [found[j].state for j in sorted(found)] == [
        "PENDING",
        "PENDING",
        "RUNNING",
        "RUNNING",
        "COMPLETED",
        "PENDING",
    ]
    assert found["201"].reason == "Resources" and found["202"].reason == "PartitionNodeLimit"
    assert found["201"].nodes == () and found["201"].start is None and found["201"].elapsed is None
    running = found["203"]
    assert running.nodes == ("n1", "n2", "n3", "n4") and running.elapsed == 62
    assert running.start == "2026-11-30T20:39:04" and running.end is None and running.exit_code is None
    assert found["204"].reason == "completing" and not found["204"].finished
    assert found["205"].finished and found["205"].end == "2026-11-30T20:39:09"
    assert found["206"].reason == "nodes are being configured"
    assert all(status.source == "squeue" for status in found.values())


def test_sacct_lines():
    found = parse_sacct(SACCT)
    failed = found["95"]
    assert (failed.state, failed.exit_code, failed.signal, failed.nodes) == (
        "FAILED",
        7,
        None,
        ("n1", "n2", "n3", "n4"),
    )
    assert failed.elapsed == 6 and failed.end == "2026-11-30T20:32:30"
    cancelled = found["100"]
    assert (cancelled.state, cancelled.raw_state, cancelled.exit_code, cancelled.signal) == (
        "CANCELLED",
        "CANCELLED by 1001",
        0,
        15,
    )
    assert (found["103"].state, found["103"].exit_code) == ("COMPLETED", 0)
    assert found["110"].state == "TIMEOUT" and found["110"].elapsed == 60
    oom = found["111"]
    assert (oom.state, oom.reason, oom.signal) == ("FAILED", "out of memory", 125)
    assert (found["112"].state, found["112"].reason, found["112"].elapsed) == ("FAILED", "node failure", 93784)
    pending = found["113"]
    assert (pending.state, pending.reason, pending.nodes, pending.exit_code, pending.start) == (
        "PENDING",
        "Priority",
        (),
        None,
        None,
    )
    assert found["114"].state == "RUNNING" and found["114"].exit_code is None and found["114"].end is None
    assert found["115"].state == "CANCELLED" and found["115"].reason == "preempted"
    assert found["116"].state == "COMPLETED"  # requeued: the last run counts


def test_describe_says_it_in_one_line():
    found = parse_sacct(SACCT)
    assert found["95"].describe() == "job 95 FAILED (exit code 7) on n[1-4] after 6 s"
    assert found["103"].describe() == "job 103 COMPLETED on n1 after 0 s"
    assert found["113"].describe() == "job 113 PENDING (Priority)"
    assert found["100"].describe() == "job 100 CANCELLED (exit code 0, signal 15) on n[1-4] after 2 s"


def test_status_round_trips_through_json():
    status = parse_sacct(SACCT)["95"]
    assert JobStatus.from_dict(status.as_dict()) == status
    assert status.as_dict()["finished"] is True


@pytest.mark.parametrize(
    "text, names",
    [
        ("n[1-4]", ("n1", "n2", "n3", "n4")),
        ("n[1-2,5],login1", ("n1", "n2", "n5", "login1")),
        ("nid[001-003]", ("nid001", "nid002", "nid003")),
        ("r[1-2]c[3-4]", ("r1c3", "r1c4", "r2c3", "r2c4")),
        ("n7", ("n7",)),
        ("", ()),
        ("None assigned", ()),
    ],
)
def test_host_lists_expand(text, names):
    assert expand_nodelist(text) == names


def test_sinfo_partitions():
    text = "debug*|up|4|infinite|0/4/0/4\nlong|up|2|1-00:00:00|1/0/1/2\nlong|up|1|1-00:00:00|0/1/0/1\n"
    debug, long = parse_sinfo(text)
    assert (
        debug.name,
        debug.default,
        debug.available,
        debug.nodes,
        debug.idle,
        debug.time_limit,
        debug.time_limit_seconds,
    ) == ("debug", True, "up", 4, 4, "infinite", None)
    assert (long.name, long.default, long.nodes, long.idle, long.allocated, long.other, long.time_limit_seconds) == (
        "long",
        False,
        3,
        1,
        1,
        1,
        86400,
    )


# --- the client's handling of failures, with stand-in commands ------------------------------


def stand_in(tmp_path, name, body):
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def test_sbatch_errors_carry_slurm_s_message(tmp_path):
    client = SlurmClient(
        commands={
            "sbatch": stand_in(
                tmp_path,
                "sbatch",
                (
                    "echo 'sbatch: error: invalid partition specified: nope' >&2; "
                    "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2; exit 1"
                ),
            )
        }
    )
    with pytest.raises(SlurmError, match=r"^sbatch: Batch job submission failed: Invalid partition name specified$"):
        client.submit(tmp_path / "job.sh")


def test_a_parsable_answer_gives_the_job_id(tmp_path):
    client = SlurmClient(commands={"sbatch": stand_in(tmp_path, "sbatch", "echo '4242;cluster'")})
    assert client.submit(tmp_path / "job.sh") == "4242"
    client = SlurmClient(commands={"sbatch": stand_in(tmp_path, "sbatch2", "echo 'Submitted batch job'")})
    with pytest.raises(SlurmError, match="unexpected answer"):
        client.submit(tmp_path / "job.sh")


# A Jupyter server's environment in the job batchspawner submitted with --export=<list> (Slurm 22.05,
# read from the server process on the stack), abridged.
IN_A_JOB = {
    "PATH": "/site/bin:/usr/bin:/bin",
    "HOME": "/home/hpcuser",
    "PODMANHPC_GRAPH_ROOT": "/tmp/g",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
    "SBATCH_ACCOUNT": "proj",
    "SLURM_EXPORT_ENV": "SLURM_CONF,PATH,HOME,PODMANHPC_GRAPH_ROOT",
    "SLURM_GET_USER_ENV": "1",
    "SLURM_JOB_ID": "3121",
    "SLURM_JOBID": "3121",
    "SLURM_JOB_NODELIST": "n1",
    "SLURM_NNODES": "1",
    "SLURM_CPUS_ON_NODE": "16",
    "SLURM_TASKS_PER_NODE": "16",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_SUBMIT_DIR": "/scratch/hub",
    "SLURM_WORKING_CLUSTER": "jph:127.0.0.1:16817:9728:109",
    "SLURMD_NODENAME": "n1",
}


def test_a_job_submitted_from_inside_a_job_inherits_none_of_its_slurm_variables():
    env = submission_environment(IN_A_JOB)
    # the user's settings for Slurm's commands stay, and everything that is not Slurm's
    assert env == {
        "PATH": "/site/bin:/usr/bin:/bin",
        "HOME": "/home/hpcuser",
        "PODMANHPC_GRAPH_ROOT": "/tmp/g",
        "SLURM_CONF": "/etc/slurm/slurm.conf",
        "SBATCH_ACCOUNT": "proj",
    }
    # outside a job (a login node) the environment is the submitter's, SLURM_* settings included
    outside = {key: value for key, value in IN_A_JOB.items() if key not in ("SLURM_JOB_ID", "SLURM_JOBID")}
    assert submission_environment(outside) == outside


def test_sbatch_runs_without_the_enclosing_job_s_variables(tmp_path):
    seen = tmp_path / "env"
    client = SlurmClient(
        env={**IN_A_JOB, "PROBE": "kept"}, commands={"sbatch": stand_in(tmp_path, "sbatch", f"env > {seen}; echo 77")}
    )
    assert client.submit(tmp_path / "job.sh") == "77"
    names = {line.split("=", 1)[0] for line in seen.read_text().splitlines()}
    assert {"PROBE", "SLURM_CONF", "SBATCH_ACCOUNT", "PATH"} <= names
    assert not {"SLURM_EXPORT_ENV", "SLURM_GET_USER_ENV", "SLURM_JOB_ID", "SLURMD_NODENAME"} & names
    assert client.env["SLURM_JOB_ID"] == "3121"  # the client's own environment is left as it was


def test_scancel_errors_are_read_from_its_output_since_it_exits_zero(tmp_path):
    client = SlurmClient(
        commands={
            "scancel": stand_in(
                tmp_path,
                "scancel",
                ("echo 'scancel: error: Kill job error on job id 9: Invalid job id specified' >&2; exit 0"),
            )
        }
    )
    with pytest.raises(SlurmError, match=r"^scancel: Kill job error on job id 9: Invalid job id specified$"):
        client.cancel("9")
    done = SlurmClient(
        commands={
            "scancel": stand_in(
                tmp_path,
                "scancel2",
                ("echo 'scancel: error: Kill job error on job id 9: Job/step already completing or completed' >&2"),
            )
        }
    )
    done.cancel("9")


def test_a_hung_or_missing_slurm_is_an_error_not_a_hang(tmp_path):
    slow = SlurmClient(timeout=0.5, commands={"squeue": stand_in(tmp_path, "squeue", "exec sleep 30")})
    with pytest.raises(SlurmError, match=r"squeue did not answer within 0 s|squeue did not answer within 1 s"):
        slow.status("1")
    missing = SlurmClient(commands={"sinfo": str(tmp_path / "no-sinfo")})
    with pytest.raises(SlurmError, match="sinfo not found"):
        missing.partitions()


def test_job_ids_are_checked_before_they_reach_slurm():
    with pytest.raises(SlurmError, match="is not a Slurm job id"):
        SlurmClient().status("1; rm -rf /")
    with pytest.raises(SlurmError, match="is not a Slurm job id"):
        SlurmClient().cancel("-u hpcuser")


def test_status_asks_sacct_for_jobs_squeue_no_longer_knows(tmp_path):
    squeue = stand_in(tmp_path, "squeue", "echo 'slurm_load_jobs error: Invalid job id specified' >&2; exit 1")
    sacct = stand_in(tmp_path, "sacct", f"cat <<'EOF'\n{SACCT}EOF")
    client = SlurmClient(commands={"squeue": squeue, "sacct": sacct})
    assert client.status("95").exit_code == 7
    assert client.statuses(["95", "999"])["999"].state == "UNKNOWN"
    with pytest.raises(SlurmError, match="Slurm has no record of job 999"):
        client.status("999")


def test_an_end_squeue_shows_before_slurmdbd_has_it_takes_the_exit_code_from_slurmctld(tmp_path):
    # Just after the end, squeue says COMPLETED/FAILED while sacct still says RUNNING (slurmdbd lags):
    # a race the real cluster loses only now and then, so stand-ins play it.
    squeue = stand_in(tmp_path, "squeue", "echo '315|FAILED|n[1-4]|0:04|2026-12-01T03:06:08|2026-12-01T03:06:12|None'")
    sacct = stand_in(tmp_path, "sacct", "echo '315|RUNNING|0:0|n[1-4]|00:00:04|2026-12-01T03:06:08|Unknown|None'")
    scontrol = stand_in(
        tmp_path,
        "scontrol",
        ("echo 'JobId=315 JobState=FAILED Reason=NonZeroExitCode DerivedExitCode=0:0 ExitCode=3:0 NodeList=n[1-4]'"),
    )
    status = SlurmClient(commands={"squeue": squeue, "sacct": sacct, "scontrol": scontrol}).status("315")
    assert (status.state, status.exit_code, status.signal, status.source) == ("FAILED", 3, None, "squeue")


def test_scontrol_exit_codes_are_read_and_derived_ones_ignored():
    assert parse_scontrol_exit_code("JobId=9 DerivedExitCode=5:0 ExitCode=0:15 Foo=bar") == (0, 15)
    assert parse_scontrol_exit_code("slurm_load_jobs error: Invalid job id specified") == (None, None)
