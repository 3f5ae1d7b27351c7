"""The step rendezvous (jupyter_podman_hpc/rank.py): an abstract unix socket, so anyone on the node's
network namespace, another user or a ``--network host`` container of the victim, can bind a name
first or connect to it.

- hpcoutsider binds every name it can derive for the victim's next steps (podman-hpc's old
  ``<uid>/<job>.<step>.<node>``, the keyed scheme with keys of its own) and serves a plan that
  would create a file as the victim: the victim's steps run as ever, nobody even connects;
- a container of the victim without the key does the same: the steps run;
- a container of the victim that reads the key (its home bound in) binds the true name of the next
  step: every task refuses it in one line (exit 125), runs nothing, and the next step runs;
- such a container connecting to a running step's monitor to ask for a plan is refused.

Each squatter serves a plan whose ``argv`` would create a marker file on the host, outside the
container, where only a task of the victim could create it: the marker never appears.
"""

import os
import subprocess
import time
import uuid

import pytest

from tests.helpers.commands import run

NODE = "n1"
STEPS = range(12)  # the job's next steps: every one is squatted
# Binds every name it can derive for the steps, serves a plan whose argv creates the marker on the
# host (in the old plan format too: podman-hpc before keyed names ran argv[0] from any plan of a
# peer with the victim's uid). Prints "key ..." and "ready N", then "connected" per connection.
SQUATTER = r"""
import _blake2, marshal, os, select, signal, socket, sys
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as a container's PID 1 too
uid, job, node, steps, key_path, marker = sys.argv[1:7]
first, last = (int(n) for n in steps.split("-"))
keys = [bytes(32), b"podman-hpc", b""]
for path in [key_path, os.path.expanduser("~/.cache/podman-hpc/rendezvous/key")]:
    try:
        keys.append(open(path, "rb").read())
        print("key read", path, flush=True)
    except OSError as err:
        print("key unreadable", path, err.strerror, flush=True)
listeners = {}
for step in range(first, last + 1):
    name = f"{job}.{step}.{node}"
    addresses = {f"\0podman-hpc/{uid}/{name}"}
    for key in keys:
        addresses.add(f"\0podman-hpc/{uid}/" + _blake2.blake2b(name.encode(), digest_size=16, key=key).hexdigest())
    for address in addresses:
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(address)
        except OSError:
            continue
        s.listen(64)
        listeners[s] = f"podman-hpc-{uid}-{name}"
print("ready", len(listeners), flush=True)
touch = ["/bin/sh", "-c", f"touch {marker}"]
while True:
    for s in select.select(list(listeners), [], [])[0]:
        c, _ = s.accept()
        print("connected", flush=True)
        try:
            c.settimeout(5)
            c.recv(65536)
        except OSError:
            pass
        plan = {"join": False, "command": ["true"], "env": None, "workdir": None,
                "argv": [*touch, "exec", listeners[s], "true"], "pid": 1, "pmi_fd": None,
                "podman_env": {"PATH": "/usr/bin:/bin"}}
        data = marshal.dumps({"plan": plan})
        try:
            c.sendall(len(data).to_bytes(4, "big") + data)
        except OSError:
            pass
"""
# From inside a container of the victim: connect to a running step's monitor (its true name,
# from the key) and ask for a plan; prints "refused" if the monitor closes without answering.
ASKER = r"""
import _blake2, marshal, os, signal, socket, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # as a container's PID 1 too
uid, job, node, steps, key_path = sys.argv[1:6]
first, last = (int(n) for n in steps.split("-"))
key = open(key_path, "rb").read()
addresses = [f"\0podman-hpc/{uid}/" + _blake2.blake2b(f"{job}.{step}.{node}".encode(), digest_size=16,
                                                      key=key).hexdigest() for step in range(first, last + 1)]
print("ready", flush=True)
deadline = time.time() + 60
connected = None
while connected is None:
    for address in addresses:
        c = socket.socket(socket.AF_UNIX)
        try:
            c.connect(address)
            connected = c
            break
        except OSError:
            c.close()
    if time.time() > deadline:
        sys.exit("no step")
    time.sleep(0.02)
c = connected
data = marshal.dumps({"kind": "plan", "argv": ["shared-run", "img", "true"], "env": dict(os.environ), "cwd": "/"})
try:
    c.sendall(len(data).to_bytes(4, "big") + data)
    c.settimeout(30)
    answer = c.recv(65536)
except (BrokenPipeError, ConnectionResetError):  # closed by the monitor before or after the request
    answer = b""
print("answered" if answer else "refused", flush=True)
"""


@pytest.fixture
def job(squashed_tiny, stack):
    """A job of the victim holding node n1, whose steps the tests launch (step ids 0, 1, ...)."""
    env = squashed_tiny.env
    job_id = run(
        ["sbatch", "--parsable", "-N1", "-w", NODE, "-o", "/dev/null", "--wrap", "sleep 900"], env=env
    ).stdout.strip()
    deadline = time.monotonic() + 120
    while run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env, check=False).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {job_id} did not start"
        time.sleep(0.5)
    yield job_id
    run(["scancel", job_id], env=env, check=False)


def cancel(hpc, job_id):
    """End the job and wait until its node is free again (for leftovers, which uses every node)."""
    run(["scancel", job_id], env=hpc.env, check=False)
    deadline = time.monotonic() + 120
    while run(["squeue", "-h", "-j", job_id], env=hpc.env, check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} did not end"
        time.sleep(0.5)


def victim_step(hpc, stack, job_id, *command, check=True):
    """One podman-exec step of the victim on n1: 4 tasks print their rank and the image's name."""
    command = command or ("sh", "-c", 'echo "$SLURM_PROCID $(head -1 /etc/os-release)"')
    return run(
        [
            "srun",
            "--jobid",
            job_id,
            "--overlap",
            "-w",
            NODE,
            "-N1",
            "-n4",
            "podman-hpc",
            "shared-run",
            stack.tiny_image,
            *command,
        ],
        env=hpc.env,
        check=check,
        timeout=300,
    )


def assert_ran(result):
    assert sorted(result.stdout.split("\n")[:-1]) == [f'{rank} NAME="jph tiny"' for rank in range(4)], result.stderr


class Squatter:
    """The squatter's process (on the host as another user, or in a container), read line by line."""

    def __init__(self, argv, env):
        self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        while True:
            line = self.process.stdout.readline()
            assert line, f"the squatter exited: {self.process.stderr.read()[-2000:]}"
            self.lines.append(line.strip())
            if line.startswith("ready"):
                assert int(line.split()[1]) > 0, self.lines
                return

    def stop(self) -> list[str]:
        self.process.terminate()
        try:
            out, _ = self.process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            out, _ = self.process.communicate()
        return self.lines + out.split("\n")


def squatter_args(uid, job_id, key_path, marker):
    return [str(uid), job_id, NODE, f"{STEPS[0]}-{STEPS[-1]}", key_path, str(marker)]


def key_path(hpc):
    return os.path.join(hpc.env["HOME"], ".cache", "podman-hpc", "rendezvous", "key")


def in_container(base, name, *python_args, home=False):
    """``python3 -c ...`` in a --network host container of the victim (the base image)."""
    hpc, image = base
    mounts = ["-v", f"{hpc.env['HOME']}:{hpc.env['HOME']}:ro"] if home else []
    return hpc.command(
        [
            "podman-hpc",
            "run",
            "--rm",
            "--name",
            name,
            "--network",
            "host",
            *mounts,
            image,
            "python3",
            "-c",
            *python_args,
        ]
    )


@pytest.fixture
def base(squashed_base, stack):
    """The victim's base image (python3 in it), for its own containers."""
    return squashed_base, stack.base_image


@pytest.fixture
def marker(squashed_tiny):
    """Where a squatter's plan would create a file, on the host only: the victim's scratch (no
    container binds it), which no other user may write."""
    path = squashed_tiny.work / f"marker-{uuid.uuid4().hex[:8]}"
    yield path
    assert not path.exists(), "a squatter's plan ran on the host as the victim"


def test_another_user_cannot_squat_the_victims_next_steps(squashed_tiny, outsider, stack, job, marker):
    victim = squashed_tiny
    key = key_path(victim)
    victim_step(victim, stack, job, "true")  # the victim has run a step: its key exists
    refused = outsider.sh("cat", key, check=False)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr
    argv, env = outsider.command(
        [stack.venv / "bin" / "python", "-c", SQUATTER, *squatter_args(os.getuid(), job, key, marker)]
    )
    squatter = Squatter(argv, env)
    try:
        for _ in range(3):  # steps 1, 2, 3 of the job: all squatted by name
            assert_ran(victim_step(victim, stack, job))
    finally:
        lines = squatter.stop()
    assert f"key unreadable {key} Permission denied" in lines
    assert "connected" not in lines  # no task even found it
    assert not marker.exists()


def test_a_container_without_the_key_cannot_squat_the_next_steps(squashed_tiny, base, stack, job, marker):
    victim = squashed_tiny
    name = f"squatter-{uuid.uuid4().hex[:8]}"
    argv, env = in_container(base, name, SQUATTER, *squatter_args(os.getuid(), job, key_path(victim), marker))
    squatter = Squatter(argv, env)
    try:
        for _ in range(2):
            assert_ran(victim_step(victim, stack, job))
    finally:
        lines = squatter.stop()
        base[0]("rm", "--force", "--time", "0", name, check=False)
    assert any(line.startswith(f"key unreadable {key_path(victim)}") for line in lines)
    assert "connected" not in lines
    assert not marker.exists()


def test_a_container_with_the_key_is_refused_in_one_line_and_runs_nothing(squashed_tiny, base, stack, job, marker):
    victim = squashed_tiny
    key = key_path(victim)
    victim_step(victim, stack, job, "true")  # step 0: the key exists
    name = f"squatter-{uuid.uuid4().hex[:8]}"
    argv, env = in_container(base, name, SQUATTER, *squatter_args(os.getuid(), job, key, marker), home=True)
    squatter = Squatter(argv, env)
    try:
        assert f"key read {key}" in squatter.lines
        refused = victim_step(victim, stack, job, check=False)  # step 1: its true name is the container's
    finally:
        lines = squatter.stop()
        base[0]("rm", "--force", "--time", "0", name, check=False)
    assert refused.returncode == 125, refused.stderr
    assert refused.stdout == ""  # nothing ran
    errors = [line for line in refused.stderr.splitlines() if not line.startswith(("srun:", "slurmstepd"))]
    assert len(errors) == 4, refused.stderr  # one line a task
    assert all(
        line.startswith("Error: shared-run: a process in another user namespace (pid ")
        and line.endswith(": a container?) holds this step's rendezvous: refusing it, nothing was run")
        for line in errors
    ), refused.stderr
    assert "connected" in lines  # the tasks did connect, and refused what they found
    assert not marker.exists()
    assert_ran(victim_step(victim, stack, job))  # the container gone, the next step runs
    cancel(victim, job)
    assert victim.leftovers() == {}  # no monitor, container or step directory of the refused step


def test_a_container_asking_a_running_steps_monitor_for_a_plan_is_refused(squashed_tiny, base, stack, job):
    victim = squashed_tiny
    key = key_path(victim)
    victim_step(victim, stack, job, "true")  # step 0: the key exists
    name = f"asker-{uuid.uuid4().hex[:8]}"
    argv, env = in_container(base, name, ASKER, str(os.getuid()), job, NODE, f"{STEPS[0]}-{STEPS[-1]}", key, home=True)
    asker = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert asker.stdout.readline().strip() == "ready", asker.stderr.read()[-2000:]
        step = victim_step(victim, stack, job, "sh", "-c", 'sleep 6; echo "$SLURM_PROCID $(head -1 /etc/os-release)"')
        out, err = asker.communicate(timeout=120)
    finally:
        asker.kill()
        base[0]("rm", "--force", "--time", "0", name, check=False)
    assert out.strip() == "refused", err[-2000:]
    assert_ran(step)  # the step itself was not disturbed
    log = victim.srun(
        "--jobid",
        job,
        "--overlap",
        "-w",
        NODE,
        "-N1",
        "-n1",
        "cat",
        f"{victim.env['PODMANHPC_RUN_ROOT']}/shared-run-monitor.log",
    ).stdout
    assert "refused a connection from a process in another user namespace" in log, log


def test_the_squatter_scripts_bind_what_they_claim(stack, job):
    """The attack scripts themselves work: on a step no rendezvous protects (a name of the old
    scheme), the squatter is found and its plan would run: so the tests above can fail."""
    uid, name = os.getuid(), f"{job}.{STEPS[0]}.{NODE}"
    argv = [
        str(stack.venv / "bin" / "python"),
        "-c",
        SQUATTER,
        str(uid),
        job,
        NODE,
        "0-0",
        "/nonexistent",
        "/nonexistent/marker",
    ]
    squatter = Squatter(argv, dict(os.environ))
    try:
        probe = (
            "import marshal, socket, sys\n"
            f"c = socket.socket(socket.AF_UNIX); c.connect({chr(0) + 'podman-hpc/' + str(uid) + '/' + name!r})\n"
            "c.sendall(b'x')\nsize = int.from_bytes(c.recv(4), 'big')\ndata = b''\n"
            "while len(data) < size: data += c.recv(size - len(data))\n"
            "print(' '.join(marshal.loads(data)['plan']['argv'][:3]))\n"
        )
        result = run([str(stack.venv / "bin" / "python"), "-c", probe], timeout=60)
    finally:
        squatter.stop()
    assert result.stdout.strip() == "/bin/sh -c touch /nonexistent/marker"
