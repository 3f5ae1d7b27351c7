"""Every byte a rank writes reaches Slurm, and nothing is left behind: 300 srun steps of mixed
sizes (up to 4x8; per-process up to 4x2), at most 6 at once, in one allocation, per-process
(``podman-hpc run --rm`` in a step) and podman-exec (``podman-hpc shared-run``, joined and
``--no-join``), each rank writing a known number of lines on stdout and on stderr, 1 MB more
on some steps, and a last write without a newline just before it exits. Every 10th step is
cancelled (scancel) while its ranks run; at the end no container, step directory, socket,
mount or monitor remains on any node, and no monitor had to give up removing its container.
(Until 2026-12-02 the cancellations were a 200-step test of their own, test_launcher_stress.py's,
in an allocation of its own.)

Half the steps write each task's stdout and stderr to files of their own (``-o``/``-e`` with
``%t``, written by slurmstepd on the node): compared byte for byte. The other half come back
through srun itself with ``--label`` (the path ``test_launcher.py`` reads, where rank 3's
output was once lost): compared line for line per rank (srun ends a last partial line itself).

Found with it (2026-12-02): a joined rank's command inherited the SIGPIPE and SIGXFSZ that the
task's Python ignores, so the 1 MB steps' ``yes | head -c`` never ended (now reset before exec:
``stepsocket.default_signals``). Since then, 4 runs of 300 steps (100 of them per-process
``podman run --rm``, podman's default log driver): 3 passed, every byte in place; one reported
9 problems of which only the first was shown, a ``--no-join`` 4x1 step whose srun exited 1 with
its other ranks' output whole. A failure lists every problem and what the step printed besides
its ranks' own writes. On 2026-12-03 the lost output was seen again, in a fresh-clone run's
``test_launcher.py`` (rank 1 of ``srun -n8 podman-hpc run --rm``: nothing on either stream,
srun exit 0), and reproduced at load 7-10: 2 of 72 such steps lost a whole rank with podman's
default log driver (conmon copies the output to the attached podman), none of 120 with
``--log-driver passthrough`` (the task's own streams handed to the container). Per-process
tasks now run with passthrough (``perprocess.log_driver_args``).

Also found with it, in per-process steps cancelled at their start (each fixed in
``engine/run/perprocess.py``): a pid file left by a container that conmon started after podman was
killed; podman exiting 0 after scancel's SIGTERM, so that srun reported the cancelled step as a
success (step 159, twice, once in a fresh-clone run); and pid files (step 9, step 159) left by a
container started after the reaper's removal, by a podman killed just after it forked its conmon.
"""

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from jupyter_podman_hpc.engine.run.stepmonitor import MONITOR_LOG
from tests.helpers.launcher_steps import allocation, cancel_when_up, monitors_of

STEPS = 300
AT_ONCE = 6
PER_PROCESS = ("run", "--rm")
MODES = [PER_PROCESS, ("shared-run",), ("shared-run", "--no-join")]
PER_PROCESS_MAX_PER_NODE = 2
# nodes x tasks per node: mostly small, so 300 steps stay within a few minutes on 2 cores
SIZES = [(1, 1), (2, 1), (1, 1), (1, 2), (1, 1), (2, 2), (1, 1), (4, 8), (1, 1), (4, 1), (1, 1), (2, 1), (1, 8), (2, 4)]
BIG_EVERY = 15  # these steps' ranks write 1 MB more on stdout and on stderr (steps of up to 4 ranks)
CANCEL_EVERY = 10  # these steps' ranks sleep, and the step is cancelled once it runs
BIG = 1 << 20
BIG_LINE = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

# $1: lines on each stream, $2: 1 to add BIG bytes on each. The last write has no newline and the
# shell exits right after it: what a rank writes last must not be lost at the container's end.
RANK = (
    'r=$SLURM_PROCID; i=0; while [ $i -lt "$1" ]; do echo "o $r $i"; echo "e $r $i" >&2; i=$((i+1)); done; '
    f'if [ "$2" = 1 ]; then busybox yes "{BIG_LINE} $r" | head -c {BIG}; '
    f'busybox yes "{BIG_LINE} $r" | head -c {BIG} >&2; fi; '
    'printf "last-o $r"; printf "last-e $r" >&2'
)


def expected(stream: str, rank: int, lines: int, big: bool) -> bytes:
    """What rank ``rank`` writes on ``stream`` ("o" or "e")."""
    text = "".join(f"{stream} {rank} {i}\n" for i in range(lines))
    if big:
        line = f"{BIG_LINE} {rank}\n"
        text += (line * (BIG // len(line) + 1))[:BIG]
    return (text + f"last-{stream} {rank}").encode()


def plan(index: int) -> tuple[tuple[str, ...], int, int, int, bool, bool]:
    """Step ``index``'s (mode, nodes, tasks per node, lines, big, to files)."""
    nodes, per_node = SIZES[index % len(SIZES)]
    mode = MODES[index % len(MODES)]
    if mode == PER_PROCESS:  # a container per rank: 8 on a node cost minutes of the suite, and say no more
        per_node = min(per_node, PER_PROCESS_MAX_PER_NODE)
    return (
        mode,
        nodes,
        per_node,
        20 + (index * 37) % 400,
        index % BIG_EVERY == 0 and nodes * per_node <= 4,
        index % 2 == 0,
    )


def cancelled_step(job: str, index: int, image: str, env: dict) -> list[str]:
    """Step ``index`` cancelled while its ranks run: it must end failed ([] if it did)."""
    mode, nodes, per_node, *_ = plan(index)
    name = f"integrity-{index}"
    what = f"step {index} ({' '.join(mode)}, {nodes}x{per_node}, cancelled)"
    process = subprocess.Popen(
        [
            "srun",
            "--jobid",
            job,
            "--overlap",
            "-J",
            name,
            f"-N{nodes}",
            f"--ntasks-per-node={per_node}",
            "podman-hpc",
            *mode,
            image,
            "sleep",
            "60",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if not cancel_when_up(job, name, env, time.monotonic() + 60):
        process.kill()
        return [f"{what}: never seen running"]
    code = process.wait(timeout=180)
    return [] if code != 0 else [f"{what}: srun exited 0"]


def left_on_nodes(hpc) -> tuple[dict, list]:
    """What the steps left on the nodes once the monitors had a minute (they remove a container
    after the step's tasks end, so after srun returns): per node, and this host's monitors."""
    root = hpc.env["PODMANHPC_RUN_ROOT"]
    script = (
        'podman-hpc ps -a --format "container {{.Names}}"; '
        f'find {root} -type s | sed "s/^/socket /"; '
        f'cat {root}/{MONITOR_LOG} 2>/dev/null | grep -i "could not be removed" | sed "s/^/gave up /"; true'
    )
    deadline = time.monotonic() + 60
    while True:
        remaining = {
            **hpc.leftovers(within=0),
            **{n: t for n, t in hpc.on_each_node("sh", "-c", script).items() if t.strip()},
        }
        left = (remaining, monitors_of(root))  # a reaper looks for late starts for 10 s after its removal
        if left == ({}, []) or time.monotonic() > deadline:
            break
        time.sleep(2)
    if left != ({}, []):  # what the monitors said and are doing, while it is there
        for node, text in hpc.on_each_node(
            "sh", "-c", f"tail -n 30 {root}/{MONITOR_LOG}; ls -la {root}/shared-run/*; true"
        ).items():
            print(f"--- {node}\n{text}")
        for pid, cmdline in left[1]:
            wchan = Path(f"/proc/{pid}/wchan")
            print(pid, wchan.read_text() if wchan.exists() else "", cmdline)
    return left


def by_rank(labelled: str) -> dict[int, list[str]]:
    """srun --label output as each rank's lines."""
    ranks: dict[int, list[str]] = {}
    for line in labelled.split("\n")[:-1]:
        label, _, text = line.partition(": ")
        ranks.setdefault(int(label), []).append(text)
    return ranks


def unexpected(stderr: bytes, out: Path, index: int) -> list[str]:
    """What a failed step said besides its ranks' own writes: srun's stderr and the tasks' files."""
    texts = [
        stderr.decode(errors="replace"),
        *(path.read_text(errors="replace") for path in sorted(out.glob(f"{index}.err.*"))),
    ]
    said = [line for text in texts for line in text.split("\n")]
    return [line for line in said if line and not line.split(": ")[-1].startswith(("e ", "last-e ", BIG_LINE[:20]))]


@pytest.mark.timeout(1500)  # minutes on a quiet machine, more under load
def test_no_byte_of_any_rank_is_lost_and_nothing_is_left(squashed_tiny, stack):
    hpc = squashed_tiny
    env = hpc.env
    out = hpc.work / "integrity"
    out.mkdir()

    def step(index: int) -> list[str]:
        """The step's losses, one line each (none: [])."""
        if index % CANCEL_EVERY == CANCEL_EVERY - 1:
            return cancelled_step(job, index, stack.tiny_image, env)
        mode, nodes, per_node, lines, big, to_files = plan(index)
        tasks = nodes * per_node
        where = ["-o", f"{out}/{index}.out.%t", "-e", f"{out}/{index}.err.%t"] if to_files else ["--label"]
        argv = [
            "srun",
            "--jobid",
            job,
            "--overlap",
            f"-N{nodes}",
            f"--ntasks-per-node={per_node}",
            *where,
            "podman-hpc",
            *mode,
            stack.tiny_image,
            "sh",
            "-c",
            RANK,
            "sh",
            str(lines),
            str(int(big)),
        ]
        what = f"step {index} ({' '.join(mode)}, {nodes}x{per_node}, {lines} lines{', 1 MB' if big else ''})"
        try:
            result = subprocess.run(argv, env=env, capture_output=True, timeout=180)
        except subprocess.TimeoutExpired:
            return [f"{what}: still running after 180 s"]
        if result.returncode != 0:
            return [f"{what}: srun exited {result.returncode}: {unexpected(result.stderr, out, index)}"]
        losses = []
        if to_files:
            for rank in range(tasks):
                for stream, suffix in (("o", "out"), ("e", "err")):
                    path = Path(f"{out}/{index}.{suffix}.{rank}")
                    got = path.read_bytes()
                    path.unlink()
                    want = expected(stream, rank, lines, big)
                    if got != want:
                        losses.append(
                            f"{what}: rank {rank} {suffix}: {len(got)} bytes, not {len(want)}; ends {got[-60:]!r}"
                        )
        else:
            for stream, text in (("o", result.stdout), ("e", result.stderr)):
                ranks = by_rank(text.decode())
                for rank in range(tasks):
                    want = expected(stream, rank, lines, big).decode().split("\n")
                    got = ranks.get(rank, [])
                    if got != want:
                        losses.append(
                            f"{what}: rank {rank} std{'out' if stream == 'o' else 'err'}: {len(got)} "
                            f"lines, not {len(want)}; ends {got[-2:]!r}"
                        )
                if sorted(ranks) != list(range(tasks)) and set(ranks) - set(range(tasks)):
                    losses.append(f"{what}: output from ranks {sorted(set(ranks) - set(range(tasks)))}")
        return losses

    try:
        with allocation(stack, env) as job, concurrent.futures.ThreadPoolExecutor(AT_ONCE) as pool:
            losses = [loss for found in pool.map(step, range(STEPS)) for loss in found]
        assert losses == [], "\n".join(losses)
        assert left_on_nodes(hpc) == ({}, [])
    finally:  # the store is the session's: what this test left must not fail the next tests' checks
        for pid, _ in monitors_of(env["PODMANHPC_RUN_ROOT"]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        hpc.on_each_node(
            "sh",
            "-c",
            "podman-hpc rm --all --force --time 0 >/dev/null 2>&1; "
            f"rm -rf {env['PODMANHPC_RUN_ROOT']}/shared-run/* {env['PODMANHPC_RUN_ROOT']}/per-process/*; "
            "true",
        )


def test_a_rank_starts_with_the_default_signal_dispositions(squashed_tiny, stack):
    """Python ignores SIGPIPE and SIGXFSZ, and a joined task's command was exec'd with both still
    ignored: the 1 MB steps' ``yes | head`` above then ran for ever. Every mode starts a rank as
    podman run does, with SIGPIPE and SIGXFSZ at their defaults."""
    hpc = squashed_tiny
    for mode in MODES:
        result = hpc.srun("-N1", "-n1", "podman-hpc", *mode, stack.tiny_image, "grep", "^SigIgn:", "/proc/self/status")
        ignored = int(result.stdout.split()[1], 16)
        # bits are signal - 1; podman run itself may leave signal 32 (glibc's internal one) ignored
        assert (mode, ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))) == (mode, 0)
