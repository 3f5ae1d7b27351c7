"""The ``podman-hpc`` console script: podman-hpc's commands on top of the engine.

Our own commands are listed in USAGE; every other podman command is passed
through to podman with the site's HPC storage settings. Exit codes are
podman's; 125 for errors of podman-hpc itself (bad usage, configuration).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TextIO

from .engine.base import commands
from .engine.errors import EngineError, InvalidInput
from .engine.progress import Progress
from .engine.run.plan import SHARED_RUN_FLAGS, Site, wants_join, wants_reuse
from .engine.text import image_rows, text_table
from .version import __version__

# Commands import the rest of the engine when they need it: every Slurm task of a
# job step starts this script, so its start-up time is paid once per rank.

USAGE = """\
usage: podman-hpc [--squash-dir DIR] [--additional-stores DIR[,DIR...]] [--log-level LEVEL]
                  COMMAND [ARGS...]

podman-hpc commands:
  infohpc            the effective configuration, where each value comes from, the modules,
                     the unpacked copies on this node (--release-job: at a job's end, remove its own)
  images             local and squashed images (podman images options pass through)
  pull IMAGE         pull an image into the node's storage, then squash it
  migrate IMAGE      squash a local image into the squashed store (also: squash)
  rmsqi IMAGE        remove an image (or one of its names) from the squashed store
  run ... IMAGE ...  podman run with the HPC defaults and module flags
  shared-run ...     like run, with one container per node and every task exec'd into it
  build ...          podman build into the node's storage
  COMMAND ...        any other podman command, with the HPC storage settings
"""


class UsageError(InvalidInput):
    exit_code = 125


@dataclass
class Options:
    squash_dir: str | None = None
    additional_stores: list[str] = field(default_factory=list)
    log_level: str | None = None
    help: bool = False
    version: bool = False


# The global options that take no value, and the Options field each one sets.
_SWITCHES = {"-h": "help", "--help": "help", "-v": "version", "--version": "version"}


def _set_squash_dir(options: Options, value: str) -> None:
    options.squash_dir = value


def _add_stores(options: Options, value: str) -> None:
    options.additional_stores += [s for s in value.split(",") if s]


def _set_log_level(options: Options, value: str) -> None:
    options.log_level = value


# The global options that take a value (``--name=value`` or ``--name value``), and what each does with it.
_VALUED = {"--squash-dir": _set_squash_dir, "--additional-stores": _add_stores, "--log-level": _set_log_level}


def _next_value(name: str, args: list[str]) -> str:
    """The argument after option ``name``, taken from ``args``; UsageError if there is none."""
    if not args:
        raise UsageError(f"{name} needs a value")
    return args.pop(0)


def parse_globals(args: list[str]) -> tuple[Options, list[str]]:
    """The options given before the subcommand (``--squash-dir``, ``--additional-stores``, ``--log-level``,
    ``--help``, ``--version``) and the arguments after them; UsageError for an option that lacks its
    value or is not ours."""
    options = Options()
    while args and args[0].startswith("-"):
        arg = args.pop(0)
        name, has_value, value = arg.partition("=")
        if name in _SWITCHES:
            setattr(options, _SWITCHES[name], True)
        elif name in _VALUED:
            _VALUED[name](options, value if has_value else _next_value(name, args))
        else:
            raise UsageError(f"unknown option {arg} (podman options go after the command)")
    return options, args


class TerminalProgress:
    """A one-line progress bar on a terminal; silent when output is not a terminal."""

    def __init__(self, stream: TextIO = sys.stderr):
        self.stream = stream
        self.active = stream.isatty()
        self.last = ""

    def __call__(self, event: Progress) -> None:
        if not self.active:
            return
        if event.fraction is not None:
            width = 30
            done = int(event.fraction * width)
            line = f"{event.stage}: [{'#' * done}{'.' * (width - done)}] {event.fraction:4.0%} {event.message}"
        else:
            line = f"{event.stage}: {event.message}"
        if line != self.last:
            self.stream.write("\r\033[K" + line[:120])
            self.stream.flush()
            self.last = line

    def done(self) -> None:
        """End the bar's line, if one was drawn, so that what follows starts on a line of its own."""
        if self.active and self.last:
            self.stream.write("\n")
            self.stream.flush()


class Cli:
    """One invocation: the configuration, podman and the site modules."""

    def __init__(self, options: Options, environ: dict[str, str]):
        self.environ = environ
        self.site = Site.load(
            environ,
            squash_dir=options.squash_dir,
            additional_stores=options.additional_stores,
            log_level=options.log_level,
        )
        self.config, self.podman, self.modules = self.site.config, self.site.podman, self.site.modules

    # --- our commands -------------------------------------------------------

    def infohpc(self, args: list[str]) -> int:
        """``podman-hpc infohpc``: print the configuration (each key and where it came from), the image
        stores, the read path and the modules as this node sees them; with ``--release-job`` (a job's
        last step), remove the unpacked copies the job left unused instead. Exit code 0."""
        from .engine import info

        if args == ["--release-job"]:
            # The end of a job on this node (its last step: ``srun --ntasks-per-node=1 podman-hpc
            # infohpc --release-job``): the unpacked copies this job made or used, if no container
            # holds them any more, are removed now rather than at the node's next use.
            if not self.config.slurm_job_id:
                raise UsageError("infohpc --release-job is for the last step of a Slurm job (no SLURM_JOB_ID here)")
            lines = info.unpacked_copies(self.site, release_job=True)
        else:
            lines = info.report(self.site)
        for line in lines:
            print(line)
        return 0

    def images(self, args: list[str]) -> int:
        """``podman-hpc images``: print the table of the user's images, local and squashed; with podman's
        own options, podman's answer instead."""
        from .engine.images.catalog import list_images

        if args:  # podman's own options (--format, -q, filters): podman answers
            return self.exec(self.podman.command("images", *args))
        print(text_table(image_rows(list_images(self.podman))))
        return 0

    def migrate(self, args: list[str]) -> int:
        """``podman-hpc migrate IMAGE`` (or ``squash``): squash the local image into the user's store, with
        a progress bar on a terminal, and print where it went."""
        if len(args) != 1 or args[0].startswith("-"):
            raise UsageError("usage: podman-hpc migrate IMAGE")
        from .engine.images.migrate import migrate

        bar = TerminalProgress()
        try:
            result = migrate(self.podman, args[0], bar)
        finally:
            bar.done()
        verb = "squashed" if result.squashed else "already squashed"
        print(f"{verb}: {args[0]} ({result.image.short_id}) in {self.config.squash_dir}")
        return 0

    def rmsqi(self, args: list[str]) -> int:
        """``podman-hpc rmsqi IMAGE``: remove the name (the last name or an id: the image) from the squashed
        store, and print which."""
        if len(args) != 1 or args[0].startswith("-"):
            raise UsageError("usage: podman-hpc rmsqi IMAGE")
        from .engine.images.migrate import remove_squashed

        image, deleted = remove_squashed(self.podman, args[0])
        what = f"removed {image.short_id}" if deleted else f"untagged {args[0]} ({image.short_id})"
        print(f"{what} from {self.config.squash_dir}")
        return 0

    def pull(self, args: list[str]) -> int:
        """``podman-hpc pull [options] IMAGE``: podman pull into the node-local storage, then squash it into
        the user's store (a progress bar on a terminal) and print where it went."""
        if not args or args[-1].startswith("-"):
            raise UsageError("usage: podman-hpc pull [podman pull options] IMAGE")
        from .engine.images.pull import podman_pull

        quiet = not sys.stderr.isatty()
        bar = TerminalProgress()
        try:
            result = podman_pull(self.podman, args[-1], pull_args=args[:-1], progress=bar, quiet=quiet)
        finally:
            bar.done()
        if result is not None:
            verb = "squashed" if result.squashed else "already squashed"
            print(f"{verb}: {args[-1]} ({result.image.short_id}) in {self.config.squash_dir}")
        return 0

    def build(self, args: list[str]) -> int:
        """``podman-hpc build``: become ``podman build`` with the arguments as given (and the site's
        network)."""
        extra = ["--network", self.config.network] if self.config.network else []
        return self.exec(self.podman.command("build", *extra, *args))

    def run(self, args: list[str], shared: bool = False) -> int:
        """``podman-hpc run`` and ``shared-run``: one container per node shared by a step's tasks
        (shared-run, or a module that asks for it), one per task inside a Slurm step, else become
        ``podman run``; the exit code of what ran."""
        plan = self.site.plan(args, front_flags=SHARED_RUN_FLAGS)
        if plan.image is None:
            raise UsageError(f"usage: podman-hpc {'shared-run' if shared else 'run'} [options] IMAGE [COMMAND...]")
        from .engine.run.launcher import shared_run
        from .engine.run.perprocess import per_process_run
        from .engine.run.stepcontext import in_slurm_step, pmi_fd_passthrough

        if shared or plan.shared:
            return shared_run(
                self.podman,
                plan.options,
                plan.module_args,
                plan.image,
                plan.command,
                self.environ,
                join=wants_join(plan.flags, self.config.shared_run_exec_mode),
                reuse=wants_reuse(plan.flags, self.config.shared_run_reuse),
            )
        if in_slurm_step(self.environ):
            return per_process_run(self.podman, plan.options, plan.module_args, plan.image, plan.command, self.environ)
        passthrough = pmi_fd_passthrough(self.environ)
        return self.exec(self.site.run_argv(plan, passthrough.run_args), passthrough.env)

    def passthrough(self, subcommand: str, args: list[str]) -> int:
        """Any other subcommand: become podman with it, with the site's options."""
        return self.exec(self.podman.command(subcommand, *args))

    # --- help ---------------------------------------------------------------

    def help(self, subcommand: str | None = None) -> int:
        """Print podman-hpc's usage and then podman's own help (for ``run``/``shared-run``: the modules'
        options first), ``podman`` read as ``podman-hpc``."""
        if subcommand in ("run", "shared-run"):
            print(f"podman-hpc {subcommand}: podman run options, plus:")
            if subcommand == "shared-run":
                print(f"  {'--join':<22} enter the container by joining its namespaces (the default)")
                print(f"  {'--no-join':<22} enter it with podman exec (shared_run_exec_mode: podman)")
                print(
                    f"  {'--reuse':<22} the job's later steps with the same image and options use this "
                    f"container (shared_run_reuse: true)"
                )
                print(f"  {'--no-reuse':<22} a container for this step alone (the default)")
            for module in self.modules:
                if module.cli_arg and not module.hidden:
                    print(f"  {module.flag:<22} {module.help}")
            print("\nPodman options follow:")
            result = self.podman.run(self.podman.help_command("run"), check=False)
        else:
            print(USAGE)
            result = self.podman.run(self.podman.help_command(), check=False)
            print("Podman help follows:")
        print(result.stdout.replace("podman ", "podman-hpc ").rstrip())
        return 0

    # --- running podman -----------------------------------------------------

    def exec(self, argv: Sequence[str], env: dict[str, str] | None = None) -> int:
        """Become podman: its terminal handling, signals and exit code are the user's."""
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            commands.become(argv, env or self.podman.env)
        except FileNotFoundError:
            raise EngineError(f"podman not found: {argv[0]} (set podman_bin in the site configuration)", 127)


COMMANDS = {
    "infohpc": Cli.infohpc,
    "images": Cli.images,
    "migrate": Cli.migrate,
    "squash": Cli.migrate,
    "rmsqi": Cli.rmsqi,
    "pull": Cli.pull,
    "build": Cli.build,
    "run": Cli.run,
    "shared-run": lambda cli, args: cli.run(args, shared=True),
}


def main(argv: list[str] | None = None) -> int:
    """The ``podman-hpc`` command line: global options, then one of our subcommands or podman's; the exit
    code (an engine error: its code and one ``Error:`` line, Ctrl-C: 130)."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        options, args = parse_globals(args)
        if options.version:
            print(f"podman-hpc version {__version__} (jupyter-podman-hpc)")
            return 0
        cli = Cli(options, dict(os.environ))
        commands.log_to_stderr(cli.config.log_level)
        if options.help or not args:
            return cli.help()
        subcommand, rest = args[0], args[1:]
        if rest in (["--help"], ["-h"]) and subcommand in ("run", "shared-run"):
            return cli.help(subcommand)
        if subcommand in COMMANDS:
            return COMMANDS[subcommand](cli, rest)
        return cli.passthrough(subcommand, rest)
    except EngineError as err:
        print(f"Error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
