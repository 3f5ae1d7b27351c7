"""Parsing ``%podman_hpc`` lines: argparse that reports errors instead of exiting.

``parse(line)`` returns the subcommand and its options as an
``argparse.Namespace``; bad input raises ``MagicError`` carrying the
message and the usage of the subcommand it concerns, ``--help`` raises
``HelpRequested`` carrying the help text. Nothing here prints, exits or
touches the engine, so it is tested on its own.

``run`` is not parsed here beyond its position: its options are podman's
and the site's module flags, which the CLI's parser
(``jupyter_podman_hpc.engine.run.plan``) tells apart.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Sequence
from functools import partial
from typing import NoReturn

PROG = "%podman_hpc"

SUMMARY = """\
%podman_hpc COMMAND [options]     (cell magic: %%podman_hpc build ...)

commands:
  build -t NAME [--build-arg K=V] [--context DIR] [--squash]
                          build the cell body (a Containerfile) as NAME
  pull IMAGE [--no-squash]
                          pull an image, then squash it
  squash IMAGE            squash a local image into the squashed store (also: migrate)
  rmsqi IMAGE             remove an image from the squashed store
  images [TEXT]           local and squashed images (a list of records)
  run [options] [module flags] IMAGE [CMD...]
                          podman-hpc run, with the output streamed into the cell
  submit --nodes N --tasks-per-node M [--time T] ... IMAGE [CMD... | --notebook PATH | --script PATH]
                          submit a Slurm job (--preview: show its batch script only); a notebook
                          comes back executed as <name>.out.ipynb (--param NAME=VALUE: its parameters)
  jobs                    the jobs submitted from here and their states
  logs JOBID              each rank's output of a job (and its output notebook)
  cancel JOBID            cancel a job
  cluster start [--nodes N] [--tasks-per-node K] [--module M] ... IMAGE | cluster stop [ID] | cluster list
                          an IPython Parallel cluster of engines in IMAGE, for %%px
  kernel install IMAGE | kernel list | kernel remove NAME
                          container-backed Jupyter kernels
  info                    the effective configuration (as podman-hpc infohpc)
  help [COMMAND]          this text, or a command's options

Add --debug to any command to see the full traceback of an error.
"""


class MagicError(Exception):
    """A failure of a magic (bad input here, or what a command met), shown as a short
    message without a traceback: ``message`` says what, ``usage`` shows how to call the command."""

    def __init__(self, message: str, usage: str = ""):
        super().__init__(message)
        self.message = message
        self.usage = usage.strip()

    def _render_traceback_(self) -> list[str]:
        """What IPython shows instead of a traceback (it asks exceptions for this)."""
        lines = [f"podman-hpc: error: {self.message}"]
        if self.usage:
            lines += ["", *self.usage.splitlines()]
        return lines


class HelpRequested(Exception):
    """``--help`` (or ``help``): ``text`` is the help to show."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text


def _u(text: str) -> str:
    """A usage text for argparse, which %-formats it."""
    return text.replace("%", "%%")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises instead of printing and exiting."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("exit_on_error", False)
        kwargs.setdefault("add_help", False)
        super().__init__(*args, **kwargs)
        self.add_argument("-h", "--help", action=_Help, help="show this help")
        self.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="show the full traceback of an error"
        )

    def error(self, message: str) -> NoReturn:
        """Raise MagicError with argparse's message and the command's usage, instead of printing and
        exiting."""
        raise MagicError(message, self.format_usage())

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:  # pragma: no cover
        """Raise MagicError instead of exiting the kernel (argparse calls this after ``--help`` or an
        error)."""
        raise MagicError(message or f"exit {status}", self.format_usage())


class _Help(argparse.Action):
    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        raise HelpRequested(parser.format_help())


def _key_value(what: str):
    def convert(text: str) -> tuple[str, str]:
        key, sep, value = text.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"{what} needs KEY=VALUE, not {text!r}")
        return key, value

    convert.__name__ = what  # argparse names the type in its messages
    return convert


def _env_item(text: str) -> tuple[str, str | None]:
    """``K=V``, or ``K`` alone: the value of K in the kernel's environment (looked up later)."""
    key, sep, value = text.partition("=")
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        raise argparse.ArgumentTypeError(f"--env needs NAME=VALUE or NAME, not {text!r}")
    return key, value if sep else None


def _job_id(text: str) -> str:
    if not re.fullmatch(r"\d+(?:_\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a Slurm job id")
    return text


def _whole_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number")


def _job_options(command: Parser) -> None:
    """The resources, modules and environment of a job (submit and cluster start)."""
    command.add_argument("-N", "--nodes", type=_whole_number, default=1, metavar="N", help="nodes (default 1)")
    command.add_argument(
        "-n",
        "--tasks-per-node",
        "--ntasks-per-node",
        dest="tasks_per_node",
        type=_whole_number,
        default=1,
        metavar="M",
        help="tasks (ranks) per node (default 1)",
    )
    command.add_argument("-c", "--cpus-per-task", type=_whole_number, metavar="N", help="CPUs per task")
    command.add_argument("--gpus-per-node", type=_whole_number, metavar="N", help="GPUs per node")
    command.add_argument("-t", "--time", metavar="T", help="time limit: minutes, HH:MM:SS, D-HH:MM...")
    command.add_argument("-p", "--partition", metavar="P")
    command.add_argument("-A", "--account", metavar="A")
    command.add_argument("-q", "--qos", metavar="QOS")
    command.add_argument("--reservation", metavar="NAME")
    command.add_argument("-J", "--job-name", metavar="NAME")
    command.add_argument(
        "--module",
        dest="modules",
        action="append",
        default=[],
        metavar="NAME",
        help="a site module, e.g. openmpi-pmix (repeatable)",
    )
    command.add_argument(
        "-e",
        "--env",
        dest="env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_env_item,
        help="an environment variable for the job (repeatable; KEY alone: its value here)",
    )
    command.add_argument(
        "--directive",
        dest="directives",
        action="append",
        default=[],
        metavar="--OPTION=VALUE",
        help="an extra #SBATCH option, e.g. --directive=--exclusive (repeatable)",
    )


def build_parser() -> Parser:
    """The ``%podman_hpc`` parser: its commands (build, pull, images, run, jobs, logs, cancel, kernel, info,
    help...) and their options."""
    parser = Parser(prog=PROG, usage=_u(SUMMARY), description="podman-hpc from a notebook.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    build = commands.add_parser(
        "build",
        usage=_u(
            "%%podman_hpc build -t NAME [--build-arg KEY=VALUE ...] [--context DIR] [--squash]\n<Containerfile lines>"
        ),
        description="Build the cell body (a Containerfile) into the node-local storage, with live "
        "progress; --squash then puts the image in the squashed store.",
    )
    build.add_argument("-t", "--tag", required=True, metavar="NAME", help="the image name, e.g. myimage:1")
    build.add_argument(
        "--build-arg",
        dest="build_args",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        type=_key_value("--build-arg"),
        help="a build argument (repeatable)",
    )
    build.add_argument("--context", metavar="DIR", help="the build context directory (default: none)")
    build.add_argument("-f", "--file", metavar="PATH", help="read the Containerfile from PATH instead of the cell body")
    build.add_argument("--squash", action="store_true", help="squash the image once built")
    build.add_argument("--no-cache", action="store_true", help="do not use cached layers")
    build.add_argument(
        "--log",
        action="store_true",
        help="also print every line of the build output (text form; widgets always keep it)",
    )

    pull = commands.add_parser(
        "pull",
        usage=_u("%podman_hpc pull IMAGE [--no-squash]"),
        description="Pull IMAGE into the node-local storage, then squash it.",
    )
    pull.add_argument("image", metavar="IMAGE")
    pull.add_argument("--no-squash", action="store_true", help="do not squash the pulled image")

    for name in ("squash", "migrate"):
        squash = commands.add_parser(
            name, usage=_u(f"%podman_hpc {name} IMAGE"), description="Squash a local image into the squashed store."
        )
        squash.add_argument("image", metavar="IMAGE")

    rmsqi = commands.add_parser(
        "rmsqi",
        usage=_u("%podman_hpc rmsqi IMAGE"),
        description="Remove an image (or one of its names) from the squashed store.",
    )
    rmsqi.add_argument("image", metavar="IMAGE")

    images = commands.add_parser(
        "images",
        usage=_u("%podman_hpc images [TEXT]"),
        description="Local and squashed images; with TEXT, only those with a name "
        "containing it (or an id starting with it).",
    )
    images.add_argument("filter", nargs="?", metavar="TEXT")

    commands.add_parser(
        "run",
        usage=_u("%podman_hpc run [podman run options] [module flags] IMAGE [CMD...]"),
        description="podman-hpc run (with --rm unless given -d), the output streamed "
        "into the cell. Module flags: see %podman_hpc info.",
    )

    submit = commands.add_parser(
        "submit",
        usage=_u(
            "%podman_hpc submit --nodes N --tasks-per-node M [--time T] [--partition P] [--account A]\n"
            "                   [--module M ...] [--mode podman-exec|per-process] [--env K=V ...] [--preview]\n"
            "                   [--param NAME=VALUE ...]\n"
            "                   IMAGE [CMD... | --notebook PATH [ARGS...] | --script PATH [ARGS...]]"
        ),
        description="Submit IMAGE as a Slurm batch job (the same script you would submit by hand); "
        "returns a Job. --preview shows the script and submits nothing.",
    )
    _job_options(submit)
    submit.add_argument(
        "--mode",
        choices=("podman-exec", "per-process"),
        default="podman-exec",
        help="one container per node (podman-exec, the default) or per rank",
    )
    submit.add_argument("-w", "--workdir", metavar="DIR", help="working directory inside the container")
    submit.add_argument("--notebook", metavar="PATH", help="run this notebook on every rank")
    submit.add_argument("--script", metavar="PATH", help="run this Python script on every rank")
    submit.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        type=_key_value("--param"),
        help="a notebook parameter, VALUE a Python literal (e.g. --param alpha=0.5 "
        "--param name=\"'x'\"): set after the notebook's cell tagged 'parameters' (repeatable)",
    )
    submit.add_argument("--preview", action="store_true", help="show the batch script, submit nothing")
    submit.add_argument("image", metavar="IMAGE")
    submit.add_argument("argv", nargs=argparse.REMAINDER, metavar="CMD")

    commands.add_parser("jobs", usage=_u("%podman_hpc jobs"), description="The jobs submitted from here.")

    logs = commands.add_parser(
        "logs",
        usage=_u("%podman_hpc logs JOBID [--err] [--batch]"),
        description="Each rank's output of a job, prefixed with the rank.",
    )
    logs.add_argument("job_id", metavar="JOBID", type=_job_id)
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--err", action="store_true", help="the ranks' standard error instead")
    which.add_argument("--batch", action="store_true", help="Slurm's log of the batch script instead")

    cancel = commands.add_parser("cancel", usage=_u("%podman_hpc cancel JOBID"), description="Cancel a job.")
    cancel.add_argument("job_id", metavar="JOBID", type=_job_id)

    cluster = commands.add_parser(
        "cluster",
        usage=_u(
            "cluster = %podman_hpc cluster start [--nodes N] [--tasks-per-node K] [--time T]\n"
            "                [--partition P] [--module M ...] [--env K=V ...] IMAGE\n"
            "       %podman_hpc cluster stop [ID | --all]\n"
            "       %podman_hpc cluster list [--all]"
        ),
        description="IPython Parallel engines in IMAGE, one per task of a Slurm job (podman-exec), "
        "with the controller in this kernel's process tree; %%px runs on them.",
    )
    cluster_actions = cluster.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    start = cluster_actions.add_parser(
        "start",
        usage=_u(
            "cluster = %podman_hpc cluster start [--nodes N] [--tasks-per-node K] [--time T] "
            "[--partition P] [--module M ...] [--env K=V ...] IMAGE"
        ),
        description="Submit a job of engines in IMAGE and wait, with a progress bar, until all have "
        "registered; returns the cluster (cluster.client(), cluster.stop()) and makes it the "
        "target of %%px. Options mean what they mean for submit; the time limit defaults to 60 "
        "minutes.",
    )
    _job_options(start)
    start.add_argument(
        "--timeout",
        type=float,
        default=600,
        metavar="SECONDS",
        help="give up (and stop everything) when not all engines registered by then (600)",
    )
    start.add_argument(
        "--controller-ip",
        default="127.0.0.1",
        metavar="IP",
        help="the address the nodes reach the controller at (default 127.0.0.1)",
    )
    start.add_argument("image", metavar="IMAGE")
    stop = cluster_actions.add_parser(
        "stop",
        usage=_u("%podman_hpc cluster stop [ID | --all]"),
        description="Stop a cluster (by default the last one this kernel started): "
        "its engines, job, controller and connection files.",
    )
    stop.add_argument("cluster_id", nargs="?", metavar="ID", help="a cluster id or its job id")
    stop.add_argument("--all", action="store_true", help="every cluster this kernel started")
    listing = cluster_actions.add_parser(
        "list", usage=_u("%podman_hpc cluster list [--all]"), description="The running clusters of this kernel."
    )
    listing.add_argument("--all", action="store_true", help="every running cluster of yours, from any kernel")

    kernel = commands.add_parser(
        "kernel",
        usage=_u(
            "%podman_hpc kernel install IMAGE [--name NAME] "
            "[--display-name TEXT] [--module M ...]\n"
            "       %podman_hpc kernel list\n"
            "       %podman_hpc kernel remove NAME"
        ),
        description="Container-backed Jupyter kernels.",
    )
    actions = kernel.add_subparsers(dest="action", metavar="ACTION", parser_class=Parser)
    install = actions.add_parser(
        "install",
        usage=_u("%podman_hpc kernel install IMAGE [--name NAME] [--display-name TEXT] [--module M ...]"),
        description="Install a kernelspec whose kernel runs in IMAGE.",
    )
    install.add_argument("image", metavar="IMAGE")
    install.add_argument("--name", help="kernel name (default: podman-hpc-<image>)")
    install.add_argument("--display-name", help="the name shown in the launcher")
    install.add_argument(
        "--module",
        dest="modules",
        action="append",
        default=[],
        metavar="NAME",
        help="a site module to enable (repeatable)",
    )
    actions.add_parser("list", usage=_u("%podman_hpc kernel list"), description="The container kernels.")
    remove = actions.add_parser(
        "remove", usage=_u("%podman_hpc kernel remove NAME"), description="Remove a container kernel."
    )
    remove.add_argument("name", metavar="NAME")

    commands.add_parser(
        "info",
        usage=_u("%podman_hpc info"),
        description="The effective configuration, where each value comes from, the modules.",
    )
    help_ = commands.add_parser("help", usage=_u("%podman_hpc help [COMMAND]"), description="Help.")
    help_.add_argument("topic", nargs="?", metavar="COMMAND")
    return parser


_PARSER: Parser | None = None


def parser() -> Parser:
    """The ``%podman_hpc`` parser, built once per process."""
    global _PARSER
    if _PARSER is None:
        _PARSER = build_parser()
    return _PARSER


def subparser(name: str) -> Parser | None:
    """The parser of the command ``name`` (for its usage and help); None if there is no such command."""
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def split(line: str) -> list[str]:
    """The magic's line split into words as a shell would; MagicError for an unclosed quote."""
    try:
        return shlex.split(line)
    except ValueError as err:  # an unclosed quote
        raise MagicError(f"cannot split the line into words: {err}", SUMMARY)


def parse(line: str | Sequence[str]) -> argparse.Namespace:
    """The subcommand and its options; ``run`` keeps its arguments raw in ``args``."""
    words = split(line) if isinstance(line, str) else list(line)
    debug, words = _without_debug(words)
    if not words or words[0] in ("-h", "--help"):
        raise HelpRequested(SUMMARY)
    if words[0] == "run":
        return _run_words(words[1:], debug)
    if words[0] == "help":
        raise _help(words[1] if len(words) > 1 else None)
    known = _command_parser(words[0])
    namespace = _parse_args(words, known)
    namespace.debug = debug or getattr(namespace, "debug", False)
    _AFTER_PARSING.get(namespace.command, _nothing_more)(namespace, known)
    return namespace


def _without_debug(words: list[str]) -> tuple[bool, list[str]]:
    """Whether the line starts with ``--debug`` (once or more), and the words after it."""
    debug = False
    while words and words[0] == "--debug":
        debug, words = True, words[1:]
    return debug, words


def _run_words(args: list[str], debug: bool) -> argparse.Namespace:
    """``run`` with its words kept raw: the CLI's parser tells podman's options from the modules' flags."""
    if args in (["-h"], ["--help"]):
        raise HelpRequested(subparser("run").format_help())
    return argparse.Namespace(command="run", args=args, debug=debug)


def _help(topic: str | None) -> Exception:
    """What ``help [COMMAND]`` raises: the command's help, the summary, or an error for no such command."""
    found = subparser(topic) if topic else None
    if topic and found is None:
        return MagicError(f"no command {topic!r}", SUMMARY)
    return HelpRequested(found.format_help() if found else SUMMARY)


def _command_parser(word: str) -> Parser:
    """The parser of the command ``word`` names; MagicError for an option or an unknown command."""
    if word.startswith("-"):
        raise MagicError(f"unknown option {word} (options go after the command)", SUMMARY)
    known = subparser(word)
    if known is None:
        raise MagicError(f"unknown command {word!r}", SUMMARY)
    return known


def _parse_args(words: list[str], known: Parser) -> argparse.Namespace:
    """argparse's reading of ``words``; its errors carry the usage of the command ``known``."""
    try:
        return parser().parse_args(words)
    except argparse.ArgumentError as err:  # exit_on_error=False: type and choice errors come here
        raise MagicError(str(err), known.format_usage())
    except MagicError as err:
        if err.usage == parser().format_usage().strip():  # "unrecognized arguments": the command's usage
            err.usage = known.format_usage().strip()
        raise


def _needs_action(actions: str, namespace: argparse.Namespace, parser_: Parser) -> None:
    if not getattr(namespace, "action", None):
        raise MagicError(f"{namespace.command} needs an action: {actions}", parser_.format_usage())


def _nothing_more(namespace: argparse.Namespace, parser_: Parser) -> None:
    pass


def _leading_params(namespace: argparse.Namespace, words: list[str], parser_: Parser) -> list[str]:
    """``--param NAME=VALUE`` right after ``--notebook PATH`` is the notebook's parameter (not one of
    its arguments, which follow): moved to ``params``; the rest returned."""
    convert = _key_value("--param")
    while words and words[0].split("=", 1)[0] == "--param":
        _, sep, value = words[0].partition("=")
        if not sep:
            if len(words) < 2:
                raise MagicError("--param needs NAME=VALUE", parser_.format_usage())
            value, words = words[1], words[1:]
        try:  # a new list: the one there may be the parser's default, shared by every parse
            namespace.params = [*namespace.params, convert(value)]
        except argparse.ArgumentTypeError as err:
            raise MagicError(str(err), parser_.format_usage())
        words = words[1:]
    return words


def _submit_target(namespace: argparse.Namespace, parser_: Parser) -> None:
    """``IMAGE CMD...``, ``IMAGE --notebook PATH [ARGS...]`` or ``IMAGE --script PATH [ARGS...]``:
    sets ``argv`` (the command), ``notebook``/``script`` and ``args``."""
    words = list(namespace.argv)
    namespace.args = []
    if words and words[0] == "--":
        words = words[1:]
    elif words and words[0].split("=", 1)[0] in ("--notebook", "--script"):
        flag, sep, value = words[0].partition("=")
        if not sep:
            if len(words) < 2:
                raise MagicError(f"{flag} needs a PATH", parser_.format_usage())
            value, words = words[1], words[2:]
        else:
            words = words[1:]
        if getattr(namespace, flag[2:]):
            raise MagicError(f"{flag} is given twice", parser_.format_usage())
        setattr(namespace, flag[2:], value)
        words = _leading_params(namespace, words, parser_)
        namespace.args, words = words, []
    targets = [flag for flag in ("notebook", "script") if getattr(namespace, flag)]
    if len(targets) > 1:
        raise MagicError("give one of a command, --notebook and --script", parser_.format_usage())
    if targets and words:
        # --notebook/--script given before IMAGE: the words after IMAGE are its arguments
        namespace.args, words = words, []
    if not targets and not words:
        raise MagicError(
            "give the command to run after IMAGE (or --notebook PATH, --script PATH)", parser_.format_usage()
        )
    namespace.argv = words


# What a command's options still need once argparse has read them.
_AFTER_PARSING = {
    "kernel": partial(_needs_action, "install, list or remove"),
    "cluster": partial(_needs_action, "start, stop or list"),
    "submit": _submit_target,
}
