"""``jupyter podman-hpc``: the Jupyter side of podman-hpc from a terminal.

``jupyter`` runs the ``jupyter-podman-hpc`` executable for ``jupyter podman-hpc``::

    jupyter podman-hpc kernel install IMAGE [--name NAME] [--display-name TEXT]
                                      [--module NAME ...] [--podman-arg ARG ...]
                                      [--pool N] [--no-slurm]
                                      [--user | --sys-prefix | --prefix DIR]
    jupyter podman-hpc kernel list [--json] [--prefix DIR]
    jupyter podman-hpc kernel remove NAME [--prefix DIR]

Bad input gets one line on stderr and exit code 2 (usage) or 1 (anything else).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from ..engine.errors import EngineError
from ..engine.text import text_table
from ..version import __version__
from . import kernelspec

PROG = "jupyter podman-hpc"


class UsageError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump), raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        """Raise UsageError with argparse's message and a pointer to ``--help`` (main prints it as one line,
        exit code 2), instead of argparse's exit."""
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``jupyter podman-hpc``: ``kernel install IMAGE``, ``kernel list``, ``kernel remove
    NAME`` and their options."""
    parser = Parser(prog=PROG, description="podman-hpc for Jupyter: container kernels.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    kernel = commands.add_parser("kernel", help="install, list and remove container kernels")
    actions = kernel.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)

    install = actions.add_parser(
        "install",
        help="install a kernelspec that runs IMAGE's ipykernel",
        description="Install a kernelspec whose kernel runs in a podman-hpc "
        "container of IMAGE (which needs python3 and ipykernel).",
    )
    install.add_argument("image", metavar="IMAGE", help="image reference, e.g. registry/name:tag")
    install.add_argument("--name", help="kernel name (default: podman-hpc-<image>)")
    install.add_argument("--display-name", help="name shown in the launcher (default: 'Python (podman-hpc: IMAGE)')")
    install.add_argument(
        "--module",
        action="append",
        default=[],
        metavar="NAME",
        help="site module to enable (repeatable), e.g. --module gpu",
    )
    install.add_argument(
        "--podman-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra `podman run` option (repeatable), e.g. --podman-arg=--shm-size=1g",
    )
    install.add_argument("--python", default="python3", help="python command inside the image (default: python3)")
    install.add_argument(
        "--pool",
        type=int,
        metavar="N",
        help=f"keep N kernels started ahead of need in each Jupyter server (0-{kernelspec.MAX_POOL}; "
        "default: the server's c.PodmanHPC.kernel_pool, 1 unless the site set another)",
    )
    install.add_argument(
        "--no-slurm",
        dest="slurm",
        action="store_false",
        help="without the host's Slurm inside the kernel (the slurm module)",
    )
    where = install.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter data dir (the default)")
    where.add_argument("--sys-prefix", action="store_true", help=f"this environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="DIR", help="DIR/share/jupyter/kernels")

    listing = actions.add_parser("list", help="list container kernels")
    listing.add_argument("--json", action="store_true", help="JSON output")
    listing.add_argument("--prefix", metavar="DIR", help="also look in DIR/share/jupyter/kernels")

    remove = actions.add_parser("remove", help="remove a container kernel")
    remove.add_argument("name", metavar="NAME")
    remove.add_argument("--prefix", metavar="DIR", help="also look in DIR/share/jupyter/kernels")
    return parser


def _install(args: argparse.Namespace) -> int:
    """``kernel install IMAGE``: install the kernelspec and say where."""
    kernel = kernelspec.install(
        args.image,
        name=args.name,
        display_name=args.display_name,
        modules=args.module,
        prefix=args.prefix,
        sys_prefix=args.sys_prefix,
        podman_args=args.podman_arg,
        python=args.python,
        pool=args.pool,
        slurm=args.slurm,
    )
    print(f"installed kernel {kernel.name} ({kernel.display_name}) in {kernel.path}")
    return 0


def _list(args: argparse.Namespace) -> int:
    """``kernel list``: the container kernels, as JSON or a table; a warning on stderr for each
    kernelspec that could not be read."""
    problems: list[str] = []
    kernels = kernelspec.list_kernels(args.prefix, problems)
    for problem in problems:  # the others are listed all the same
        print(f"{PROG}: warning: {problem}", file=sys.stderr)
    if args.json:
        print(json.dumps([k.as_dict() for k in kernels], indent=1))
        return 0
    rows = [("NAME", "IMAGE", "MODULES", "POOL", "PATH")]
    rows += [(k.name, k.image, ",".join(k.modules) or "-", _pool_text(k.pool), k.path) for k in kernels]
    print(text_table(rows))
    return 0


def _pool_text(pool: int | None) -> str:
    """A kernel's pool size in the table ("-": the server's default)."""
    return "-" if pool is None else str(pool)


def _remove(args: argparse.Namespace) -> int:
    """``kernel remove NAME``: remove the kernelspec and say from where."""
    kernel = kernelspec.remove(args.name, args.prefix)
    print(f"removed kernel {kernel.name} from {kernel.path}")
    return 0


ACTIONS = {"install": _install, "list": _list, "remove": _remove}


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Carry out the parsed command (install, list or remove a container kernel), printing what it did; the
    exit code."""
    if args.command != "kernel":
        parser.print_help()
        return 0 if args.command is None else 2
    action = ACTIONS.get(args.action)
    if action is None:
        raise UsageError(f"usage: {PROG} kernel install|list|remove ... (see `{PROG} kernel --help`)")
    return action(args)


def main(argv: list[str] | None = None) -> int:
    """The ``jupyter podman-hpc`` console script: 0 on success, 2 with one line for bad usage, 1 with one
    line for an engine error, 130 on Ctrl-C."""
    parser = build_parser()
    try:
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        return run(args, parser)
    except UsageError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 2
    except EngineError as err:
        print(f"{PROG}: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
