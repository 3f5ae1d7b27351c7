"""Reading perf's process events into programs (bench/podman_phases.py): only the command's tree and
a node's, a forked process running on in its parent's program, an exec ending the one before."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import podman_phases

# perf script -F comm,pid,tid,time,event,trace, as recorded here (pids shortened); 900 is another
# user's podman, 50 a node's slurmd
SCRIPT = """\
         runuser   100/100   10.000000: sched:sched_process_exec: filename=/usr/sbin/runuser pid=100 old_pid=100
          podman   900/900   10.001000: sched:sched_process_exec: filename=/usr/bin/podman pid=900 old_pid=900
         runuser   100/100   10.002000: sched:sched_process_fork: comm=runuser pid=100 child_comm=runuser child_pid=101
          podman   101/101   10.003000: sched:sched_process_exec: filename=/usr/bin/podman pid=101 old_pid=101
          podman   101/105   10.004000: sched:sched_process_fork: comm=podman pid=105 child_comm=podman child_pid=102
          conmon   102/102   10.050000: sched:sched_process_exec: filename=/usr/bin/conmon pid=102 old_pid=102
          conmon   102/102   10.051000: sched:sched_process_fork: comm=conmon pid=102 child_comm=conmon child_pid=103
          conmon   102/102   10.052000: sched:sched_process_exit: comm=conmon pid=102 prio=120 group_dead=true
          conmon   103/103   10.053000: sched:sched_process_fork: comm=conmon pid=103 child_comm=conmon child_pid=104
            runc   104/104   10.054000: sched:sched_process_exec: filename=/usr/bin/runc pid=104 old_pid=104
             exe   104/104   10.060000: sched:sched_process_exec: filename=/proc/self/exe pid=104 old_pid=104
            true   104/104   10.070000: sched:sched_process_exec: filename=/bin/true pid=104 old_pid=104
            true   104/104   10.071000: sched:sched_process_exit: comm=true pid=104 prio=120 group_dead=true
          podman   900/900   10.080000: sched:sched_process_exit: comm=podman pid=900 prio=120 group_dead=true
          conmon   103/103   10.090000: sched:sched_process_exit: comm=conmon pid=103 prio=120 group_dead=true
          podman   101/107   10.095000: sched:sched_process_exit: comm=podman pid=107 prio=120 group_dead=true
          slurmd    50/50    10.096000: sched:sched_process_fork: comm=slurmd pid=50 child_comm=slurmd child_pid=51
       slurmstep    51/51    10.097000: sched:sched_process_exec: filename=/usr/sbin/slurmstepd pid=51 old_pid=51
"""


def test_the_command_and_the_nodes_programs_with_their_lifetimes():
    programs = podman_phases.parse(SCRIPT, roots={50})
    rows = [(p.name, p.pid, round(p.start - 10, 3), None if p.end is None else round(p.end - 10, 3)) for p in programs]
    assert rows == [
        ("runuser", 100, 0.0, None),
        ("podman", 101, 0.003, 0.095),  # its last thread's exit ends it
        ("conmon", 102, 0.05, 0.09),  # the daemonized child runs on in conmon's program
        ("runc", 104, 0.054, 0.06),  # ended by its own next exec
        ("runc init", 104, 0.06, 0.07),
        ("true", 104, 0.07, 0.071),
        ("slurmstepd", 51, 0.097, None),
    ]


def test_the_table_gives_medians_by_program_and_occurrence():
    runs = [podman_phases.parse(SCRIPT, roots=set())] * 3
    text = podman_phases.table(runs)
    assert "| conmon | 3 | 50.0 | 40.0 |" in text
    assert "| true | 3 | 70.0 | 1.0 |" in text
    assert "podman (2)" not in text and "slurmstepd" not in text
