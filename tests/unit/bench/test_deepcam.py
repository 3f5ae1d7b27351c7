"""The DeepCAM-like benchmark's reading of its ranks' lines (bench/deepcam.py): phases end at
the slowest rank's milestones, and a run whose ranks are missing, disagree or learnt nothing
gives no number. The runs themselves are tests/bench (the stack)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))

import deepcam
from common import BenchError


def line(
    rank: int,
    first_line: float,
    first_iter: float,
    end: float,
    first_loss: float = 1.0,
    last_loss: float = 0.5,
    checksum: float = 2000.0,
) -> str:
    return (
        f"DEEPCAM rank={rank} first_line={first_line:.6f} first_iter={first_iter:.6f} end={end:.6f} "
        f"first_loss={first_loss:.6f} last_loss={last_loss:.6f} checksum={checksum:.6f}"
    )


def test_phases_end_at_the_slowest_ranks_milestones():
    # rank 1 starts late; rank 0 waits for it at the rendezvous
    out = "\n".join([line(0, 100.5, 103.0, 113.0), "noise from srun", line(1, 101.5, 103.2, 113.4)])
    phases = deepcam.phases(out, started=100.0, step=14.0, ranks=2, label="t")
    assert phases.container_start == pytest.approx(1.5)
    assert phases.startup == pytest.approx(1.7)
    assert phases.loop == pytest.approx(10.2)
    assert phases.container_start + phases.startup + phases.loop == pytest.approx(13.4)
    assert phases.step == 14.0


@pytest.mark.parametrize(
    "out, message",
    [
        (line(0, 1, 2, 3), r"ranks \[0\] reported, not 0-1"),
        (line(0, 1, 2, 3) + "\n" + line(0, 1, 2, 3), r"ranks \[0, 0\] reported, not 0-1"),  # rank 0 twice
        (line(0, 1, 2, 3) + "\n" + line(1, 1, 2, 3, checksum=2001.0), "trained weights differ"),
        (line(0, 1, 2, 3, last_loss=1.0) + "\n" + line(1, 1, 2, 3, last_loss=1.0), "loss did not go down"),
    ],
)
def test_a_run_that_did_not_train_on_every_rank_gives_no_number(out, message):
    with pytest.raises(BenchError, match=message):
        deepcam.phases(out, started=0.0, step=4.0, ranks=2, label="t")
