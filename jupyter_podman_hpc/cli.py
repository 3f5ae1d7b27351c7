"""The `podman-hpc` console script."""

import sys


def main(argv: list[str] | None = None) -> int:
    print("podman-hpc: not implemented yet", file=sys.stderr)
    return 125
