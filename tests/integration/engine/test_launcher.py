"""The node-level launcher on the 4-node cluster: podman-exec (shared-run) and per-process."""

import os
import subprocess
import time
import uuid
from signal import SIGKILL

import psutil
import pytest

from jupyter_podman_hpc.engine.base.locks import NEW_LOCK_GRACE
from jupyter_podman_hpc.engine.run.stepmonitor import MONITOR_LOG
from tests.helpers.commands import run
from tests.helpers.launcher_steps import monitors_of, recording_podman

# Each rank prints its rank, its node, the container it runs in (its pid namespace and
# the start time of that namespace's pid 1: namespace numbers alone are reused) and the OS.
REPORT = (
    'echo "$SLURM_PROCID $SLURMD_NODENAME $(readlink /proc/self/ns/pid)@$(cut -d" " -f22 /proc/1/stat) '
    '$(grep ^ID= /etc/os-release)"'
)


def reports(result):
    rows = [line.split() for line in result.stdout.splitlines() if line.strip()]
    return {int(rank): (node, pidns, os_id) for rank, node, pidns, os_id in rows}


def test_podman_exec_runs_one_container_per_node(squashed_tiny, stack):
    hpc = squashed_tiny
    result = hpc.srun("-N4", "-n8", "podman-hpc", "shared-run", stack.tiny_image, "sh", "-c", REPORT)
    ranks = reports(result)
    assert sorted(ranks) == list(range(8))
    assert {os_id for _, _, os_id in ranks.values()} == {"ID=tiny"}  # inside the image
    per_node = {}
    for node, pidns, _ in ranks.values():
        per_node.setdefault(node, set()).add(pidns)
    assert sorted(per_node) == list(stack.nodes)
    assert all(len(namespaces) == 1 for namespaces in per_node.values())  # one container a node
    assert len({pidns for _, pidns, _ in ranks.values()}) == 4
    assert hpc.leftovers() == {}


def test_per_process_mode_runs_one_container_per_rank(squashed_tiny, stack):
    hpc = squashed_tiny
    result = hpc.srun("-N4", "-n8", "podman-hpc", "run", "--rm", stack.tiny_image, "sh", "-c", REPORT)
    ranks = reports(result)
    assert sorted(ranks) == list(range(8))
    assert len({pidns for _, pidns, _ in ranks.values()}) == 8
    assert hpc.leftovers() == {}


def test_a_failing_rank_fails_the_step_with_its_code_and_nobody_hangs(squashed_tiny, stack):
    hpc = squashed_tiny
    command = 'if [ "$SLURM_PROCID" = 5 ]; then exit 7; fi; sleep 2'
    result = hpc.srun(
        "-N4", "-n8", "podman-hpc", "shared-run", stack.tiny_image, "sh", "-c", command, check=False, timeout=120
    )
    assert result.returncode == 7
    crashed = hpc.srun(
        "-N4",
        "-n8",
        "podman-hpc",
        "shared-run",
        stack.tiny_image,
        "sh",
        "-c",
        'if [ "$SLURM_PROCID" = 2 ]; then kill -9 $$; fi; sleep 2',
        check=False,
        timeout=120,
    )
    assert crashed.returncode == 137
    assert hpc.leftovers() == {}


def test_steps_and_a_stale_container_never_share_a_name(squashed_tiny, stack):
    hpc = squashed_tiny
    image = stack.tiny_image
    # In one allocation: step 0 leaves a container named as step 1's will be, as a crashed
    # step would; steps 1 and 2 then run at the same time on the same nodes.
    script = hpc.work / "steps.sh"
    stale_run = 'podman-hpc run -d --name "podman-hpc-$(id -u)-$SLURM_JOB_ID.1.$SLURMD_NODENAME"'
    shared_run = f"srun --overlap -N4 -n8 podman-hpc shared-run {image} sh -c"
    # which container a rank ran in: its pid namespace and the start time of that namespace's init
    container = '$(readlink /proc/self/ns/pid)@$(cut -d" " -f22 /proc/1/stat)'
    script.write_text(f"""#!/bin/sh
srun -N4 --ntasks-per-node=1 sh -c '{stale_run} {image} sh -c "touch /stale; sleep 600"' >/dev/null
{shared_run} 'test -e /stale && echo stale || echo "fresh {container}"' > {hpc.work}/step1.out &
{shared_run} 'echo "other {container}"' > {hpc.work}/step2.out &
wait
""")
    run(["sbatch", "--wait", "-N4", "-o", hpc.work / "job.out", script], env=hpc.env, timeout=300)
    first = (hpc.work / "step1.out").read_text().split("\n")
    second = (hpc.work / "step2.out").read_text().split("\n")
    first_ns = {line.split()[1] for line in first if line}
    second_ns = {line.split()[1] for line in second if line}
    assert all(line.startswith("fresh ") for line in first if line), first
    assert len(first_ns) == 4 and len(second_ns) == 4 and not first_ns & second_ns
    assert hpc.leftovers() == {}


def test_scancel_removes_every_container_within_seconds(squashed_tiny, stack):
    hpc = squashed_tiny
    script = hpc.work / "long.sh"
    script.write_text(f"#!/bin/sh\nsrun -N4 -n8 podman-hpc shared-run {stack.tiny_image} sleep 600\n")
    job = run(["sbatch", "--parsable", "-N4", "-o", hpc.work / "long.out", script], env=hpc.env).stdout.strip()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            ps = run(
                [
                    "srun",
                    "--jobid",
                    job,
                    "--overlap",
                    "-N4",
                    "--ntasks-per-node=1",
                    "podman-hpc",
                    "ps",
                    "--format",
                    "{{.Names}}",
                ],
                env=hpc.env,
                check=False,
                timeout=60,
            )
            if ps.stdout.count("podman-hpc-") == 4:
                break
            time.sleep(1)
        else:
            pytest.fail(f"the job's containers did not all start: {ps.stdout} {ps.stderr}")
    finally:
        cancelled = time.monotonic()
        run(["scancel", job], env=hpc.env)
    while run(["squeue", "-h", "-j", job], env=hpc.env, check=False).stdout.strip():
        time.sleep(0.5)
    remaining = hpc.leftovers()
    elapsed = time.monotonic() - cancelled
    assert remaining == {}, remaining
    assert elapsed < 30


def test_a_killed_monitors_container_and_directory_go_at_the_end_of_the_nodes_next_step(squashed_tiny, stack):
    """A monitor killed by SIGKILL (the OOM killer, an administrator) runs no clean-up: its container and
    step directory stay until the node's next monitor, once done, finds the directory's lock free."""
    hpc, node, name = squashed_tiny, stack.nodes[1], f"killed-monitor-{uuid.uuid4().hex[:8]}"
    step = subprocess.Popen(
        [
            "srun",
            "-J",
            name,
            "-N1",
            "-w",
            node,
            "podman-hpc",
            "shared-run",
            stack.tiny_image,
            "sh",
            "-c",
            "echo up; sleep 600",
        ],
        env=hpc.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert step.stdout.readline() == "up\n"
        # the monitor writes to its log (the step's tasks, srun and podman do not)
        monitors = [
            int(pid)
            for pid, _ in monitors_of(hpc.env["PODMANHPC_RUN_ROOT"])
            if os.readlink(f"/proc/{pid}/fd/1").endswith(f"/{MONITOR_LOG}")
        ]
        assert len(monitors) == 1, monitors
        os.kill(monitors[0], SIGKILL)
    finally:
        run(["scancel", "-n", name], env=hpc.env)
        step.wait(timeout=60)
    left_until_the_nodes_next_step(hpc, node, "stepdir ", "shared-run", stack.tiny_image, "true")
    log = hpc.srun("-w", node, "cat", f"{hpc.env['PODMANHPC_RUN_ROOT']}/{MONITOR_LOG}").stdout
    assert "its monitor was killed" in log, log


@pytest.mark.parametrize("next_step", [("run", "--rm"), ("shared-run",)], ids=["per-process", "podman-exec"])
def test_a_killed_per_process_tasks_container_goes_with_the_nodes_next_step(squashed_tiny, stack, next_step):
    """Every process of a per-process task killed by SIGKILL, as Slurm's proctrack/cgroup ends a step (the
    task, its podman, its detached reaper, conmon and the container's processes are all in the step's
    cgroup): nothing runs a clean-up, and the container's record, pid file and lock file stay until the
    node's next per-process task (at its start) or podman-exec step (at its end) finds the lock free."""
    hpc, node, name = squashed_tiny, stack.nodes[2], f"killed-task-{uuid.uuid4().hex[:8]}"
    step = subprocess.Popen(
        [
            "srun",
            "-J",
            name,
            "-N1",
            "-w",
            node,
            "podman-hpc",
            "run",
            "--rm",
            stack.tiny_image,
            "sh",
            "-c",
            "echo up; sleep 600",
        ],
        env=hpc.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert step.stdout.readline() == "up\n"
        holders = [
            psutil.Process(int(pid)) for pid, _ in monitors_of(hpc.env["PODMANHPC_RUN_ROOT"]) if lock_holder(pid)
        ]
        assert len(holders) == 2, holders  # the task and its reaper
        conmons = [
            process
            for process in psutil.process_iter(["name", "cmdline"])
            if process.info["name"] == "conmon"
            and hpc.env["PODMANHPC_RUN_ROOT"] in " ".join(process.info["cmdline"] or ())
            and "-n" in (process.info["cmdline"] or ())
        ]
        assert len(conmons) == 1, conmons
        for process in [*holders, *conmons]:
            for doomed in [process, *process.children(recursive=True)]:
                doomed.kill()
    finally:
        run(["scancel", "-n", name], env=hpc.env)
        step.wait(timeout=60)
    left_until_the_nodes_next_step(hpc, node, ".lock", *next_step, stack.tiny_image, "true")


def left_until_the_nodes_next_step(hpc, node, mark, *next_step):
    """What the killed processes left on ``node`` (their container, and ``mark``) stays until the node's
    next step (``podman-hpc *next_step``) removes it."""
    left = hpc.leftovers(within=3)
    assert "container podman-hpc-" in left.get(node, "") and mark in left[node], left
    time.sleep(NEW_LOCK_GRACE)
    hpc.srun("-w", node, "podman-hpc", *next_step)
    assert hpc.leftovers(within=15) == {}


def lock_holder(pid):
    """Whether process ``pid`` holds a per-process task's lock file open."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if "/per-process/" in target and target.endswith(".lock"):
            return True
    return False


def test_joining_the_container_is_as_faithful_as_podman_exec(squashed_base, stack):
    """Joining (the default) gives a task what podman exec (shared_run_exec_mode: podman) gives
    it: same user, groups, capabilities, environment, working directory, mounts, namespaces,
    limits, umask and exit code."""
    hpc = squashed_base
    probe = (
        'id; umask; pwd; env | grep -v -E "^(_|SHLVL|PWD)=" | sort; grep -E "^Cap|^NoNewPrivs|^Seccomp" '
        "/proc/self/status; for n in ipc mnt net pid user uts; do readlink /proc/self/ns/$n; done; "
        'cut -d" " -f1,2,5 /proc/self/mountinfo | sed "s/^/mountinfo /"; ulimit -n; ulimit -u; '
        'echo "pmi fd: $(readlink /proc/self/fd/$PMI_FD | cut -d: -f1)"; exit 3'
    )
    outputs, execs = {}, {}
    for join in (False, True):
        podman, calls = recording_podman(hpc, "join" if join else "exec")
        mode = {} if join else {"PODMANHPC_SHARED_RUN_EXEC_MODE": "podman"}
        result = run(
            [
                "srun",
                "--mpi=pmi2",
                "-N1",
                "-n2",
                "podman-hpc",
                "shared-run",
                "-e",
                "EXTRA=1",
                "-w",
                "/etc",
                stack.base_image,
                "bash",
                "-c",
                probe + " # $SLURM_LOCALID",
            ],
            env={**hpc.env, **mode, "PODMANHPC_PODMAN_BIN": podman},
            check=False,
        )
        assert result.returncode == 3, result.stderr
        outputs[join] = result.stdout
        execs[join] = [
            line for line in calls.read_text().splitlines() if " exec " in f" {line} " and not line.endswith("--help")
        ]
    podman_exec, joined = outputs[False], outputs[True]
    assert len(execs[False]) == 2 and execs[True] == []  # each task really went its own way
    assert normalized(joined) == normalized(podman_exec)
    assert "EXTRA=1" in joined and "SLURM_PROCID=1" in joined and "\n/etc\n" in joined
    assert joined.count("pmi fd: socket") == 2  # PMI_FD reaches every task, joined or not


def normalized(text):
    """The probe's output without what differs between two steps by nature: the
    namespace ids of each step's container, the kernel's ids of its mounts (each
    mount is named by its mount point and its parent's instead: the same tree), and
    the values of the Slurm variables naming the job, step, ports and pids (their
    names must match)."""
    lines, mounts = [], []
    for line in text.splitlines():
        if line.startswith(("ipc:", "mnt:", "net:", "pid:", "user:", "uts:")):
            continue
        if line.startswith("mountinfo "):
            mounts.append(line.split()[1:])
            continue
        if line.startswith(("SLURM_", "SLURMD_", "PMI_", "PMIX_")):
            line = line.split("=", 1)[0] + "=..."
        lines.append(line)
    where = {mount_id: point for mount_id, _, point in mounts}
    lines += [f"mount {point} on {where.get(parent, '(outside)')}" for _, parent, point in mounts]
    return sorted(lines)


@pytest.mark.parametrize("signal", ["TERM", "KILL"])
@pytest.mark.parametrize("mode", ["--join", "--no-join"])
def test_every_task_reports_a_command_killed_by_signal_n_as_128_plus_n(squashed_tiny, stack, mode, signal):
    """The node's first task and the others carry out their plans the one same way."""
    hpc = squashed_tiny
    script = (
        f'podman-hpc shared-run {mode} {stack.tiny_image} sh -c "sleep 1; kill -{signal} \\$\\$"; '
        'echo "task $SLURM_LOCALID $?"'
    )
    result = hpc.srun("-N1", "-n4", "sh", "-c", script, timeout=180)
    code = {"TERM": 143, "KILL": 137}[signal]
    assert sorted(result.stdout.splitlines()) == [f"task {task} {code}" for task in range(4)], result.stderr
    assert hpc.leftovers() == {}


def _processes(marker: str) -> dict[int, tuple[int, list[str]]]:
    """This user's processes whose command ends with ``sleep MARKER``: pid -> (parent, argv)."""
    found = {}
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                argv = cmdline.read().decode(errors="replace").split("\0")[:-1]
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rpartition(")")[2].split()[1])
            if os.stat(f"/proc/{entry}").st_uid != os.getuid():
                continue
        except (OSError, ValueError):
            continue
        if argv[-2:] == ["sleep", marker]:
            found[int(entry)] = (parent, argv)
    return found


def _tasks_podman(marker: str) -> tuple[list[int], int]:
    """The podman processes the tasks started (rootless podman re-executes itself: not that
    child), and how many containers run the command."""
    found = _processes(marker)
    podman = {pid for pid, (_, argv) in found.items() if os.path.basename(argv[0]) == "podman"}
    return sorted(pid for pid in podman if found[pid][0] not in podman), len(
        [pid for pid, (_, argv) in found.items() if argv == ["sleep", marker]]
    )


@pytest.mark.parametrize("mode", [("shared-run", "--no-join"), ("run", "--rm")])
def test_every_task_whose_podman_is_killed_reports_137(squashed_tiny, stack, mode):
    """SIGKILL to podman itself (exec, or run in per-process mode): 128 + 9 for every task, the
    node's first too (it returned subprocess's -9, which the shell saw as 247)."""
    hpc = squashed_tiny
    marker = str(600 + uuid.uuid4().int % 300)
    script = f'podman-hpc {mode[0]} {mode[1]} {stack.tiny_image} sleep {marker}; echo "task $SLURM_LOCALID $?"'
    argv, env = hpc.command(["srun", "-N1", "-n3", "sh", "-c", script])
    step = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while _tasks_podman(marker)[1] < 3 and time.monotonic() < deadline and step.poll() is None:
            time.sleep(0.2)  # until every task's container runs its command
        killed, running = _tasks_podman(marker)
        assert len(killed) == 3 and running == 3, _processes(marker)
        for pid in killed:
            os.kill(pid, 9)
        out, err = step.communicate(timeout=120)
    finally:
        if step.poll() is None:
            step.kill()
            step.wait()
    assert sorted(out.splitlines()) == [f"task {task} 137" for task in range(3)], err
    assert hpc.leftovers() == {}
