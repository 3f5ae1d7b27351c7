#!/usr/bin/env python3
"""Run the benchmarks on the cluster-in-a-box and write bench/results/<date>-<host>.{md,csv,*.png}.

    bench/run.py             the full comparison (make bench)
    bench/run.py --smoke     one repetition at the smallest sizes (make bench-smoke)

Run as the stack user with the stack's environment (dev/as-user does it).
"""

from __future__ import annotations

import argparse
import datetime as dt
import shutil
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import launch  # noqa: E402
import report  # noqa: E402
import squash  # noqa: E402
from common import Sample, machine  # noqa: E402

FULL_SIZES = [(n, k) for n in (1, 2, 4) for k in (1, 2, 4, 8)]
SMOKE_SIZES = [(1, 1)]
LAUNCH_CONFIGS = ["bare", "podman-exec", "podman-exec --join", "per-process", "1.2.2 shared-run", "1.2.2 run"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="one repetition, smallest sizes")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=["launch", "squash"], help="benchmarks to run")
    parser.add_argument("--image", default=None, help="image to launch (default: the stack's base image)")
    parser.add_argument("--output", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)

    import os
    repetitions = 1 if args.smoke else args.repetitions
    sizes = SMOKE_SIZES if args.smoke else FULL_SIZES
    image = args.image or (os.environ["STACK_TINY_IMAGE"] if args.smoke else os.environ["STACK_BASE_IMAGE"])
    work = Path(os.environ["SCRATCH"]) / "bench" / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    work.mkdir(parents=True)
    samples: list[Sample] = []
    try:
        setup = launch.prepare(image, work, with_peer=True)
        if "launch" in args.only:
            samples += launch.measure(setup, LAUNCH_CONFIGS, sizes, repetitions)
        if "squash" in args.only:
            samples += squash.measure(setup, work / "squash", repetitions)
    finally:
        import subprocess
        subprocess.run(["podman", "unshare", "rm", "-rf", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    stem = f"{dt.date.today().isoformat()}-{socket.gethostname()}{'-smoke' if args.smoke else ''}"
    path = report.write(samples, machine(), args.output, stem, smoke=args.smoke)
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
