"""The one place podman command lines are built and run.

``Podman`` adds the HPC storage settings of the site configuration (graph
root, run root, mount program, the squashed store as an additional image
store, hooks, ...) to every call, as podman-hpc does, and runs podman with
the environment podman-hpc gives it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from .base import commands
from .base.files import atomic_write
from .errors import PodmanError
from .site.config import SiteConfig
from .site.modules import HOOK_ANNOTATION
from .statebinds import guard
from .store.access import make_store_dir, readable_stores

HOOK_FILE = "02-hook_tool.json"

# Subcommands that must not see the squashed store: they write images, or
# read layer contents that the store keeps only inside its squash files.
WITHOUT_SQUASHED = {
    "build",
    "buildx",
    "pull",
    "push",
    "save",
    "load",
    "import",
    "commit",
    "tag",
    "untag",
    "rmi",
    "manifest",
    "login",
    "logout",
    "unshare",
    "mount",
    "umount",
    "unmount",
    "system reset",
    "image rm",
    "image prune",
    "image tag",
}
CONTAINER_STARTERS = {"run", "create"}
# subcommands whose containers may be given binds and --ipc=host: the engine's state is kept out of them
STATE_GUARDED = CONTAINER_STARTERS | {"build"}


class Podman:
    """podman with a site's HPC settings."""

    def __init__(self, config: SiteConfig, environ: Mapping[str, str] | None = None):
        self.config = config
        self.env = config.podman_env(environ)
        # before podman reads a containers.conf or a hook from them, or creates them itself
        config.prepare_state()

    # --- command lines ----------------------------------------------------

    def global_args(self, subcommand: str, squashed: bool | None = None, words: Sequence[str] = ()) -> list[str]:
        """Storage and engine flags, placed before the subcommand."""
        if squashed is None:
            squashed = _sees_squashed(subcommand, words)
        args = self._storage_args(subcommand, squashed, words) if self.config.use_default_args else []
        return args + _flags(("--runtime", self.config.runtime), ("--log-level", self.config.log_level))

    def _storage_args(self, subcommand: str, squashed: bool, words: Sequence[str]) -> list[str]:
        """podman-hpc's default storage flags: its graph and run roots, mount program, stores and hooks."""
        c = self.config
        args = ["--root", c.graph_root, "--runroot", c.run_root, "--storage-opt", f"mount_program={c.mount_program}"]
        args += _flags(("--cgroup-manager", c.cgroup_manager))
        args += self._store_args(squashed)
        # the API service starts containers (and pulls) too
        starts = subcommand in CONTAINER_STARTERS or (subcommand == "system" and "service" in words[1:2])
        if starts or subcommand == "pull":
            args += ["--storage-opt", "ignore_chown_errors=true"]
        if starts:
            args += ["--hooks-dir", c.hooks_dir]
        return args

    def _store_args(self, squashed: bool) -> list[str]:
        """The squashed stores as additional image stores, for a command that sees them."""
        # podman refuses to start with a missing store: the user's own squashed
        # store is made on first use (a long-running API service must see it
        # from the start); a site store that is missing is left out, one we
        # may not read is refused in one line (personal first: it wins names).
        # Commands that do not see the stores (pull, build...) leave the file system alone.
        if not squashed:
            return []
        if self.config.squash_dir:
            make_store_dir(self.config.squash_dir)
        stores = readable_stores(self.config)
        return ["--storage-opt", f"additionalimagestore={','.join(stores)}"] if stores else []

    def run_defaults(self) -> list[str]:
        """Options every container started through podman-hpc gets."""
        c = self.config
        args: list[str] = []
        if c.use_default_args:
            args += ["--security-opt", "seccomp=unconfined"]
        if c.network:
            args += ["--network", c.network]
        for limit in c.ulimits:
            args += ["--ulimit", limit]
        return args

    def command(self, subcommand: str | Sequence[str], *args: str, squashed: bool | None = None) -> list[str]:
        """``podman <globals> <subcommand...> <args>``; one that starts containers keeps the engine's
        state out of them (``keep_state_out``)."""
        words = [subcommand] if isinstance(subcommand, str) else list(subcommand)
        words_and_args = self.keep_state_out([*words, *args])
        return [self.config.podman_bin, *self.global_args(words[0], squashed, words_and_args), *words_and_args]

    def keep_state_out(self, words: list[str]) -> list[str]:
        """The words of a podman command that starts containers (``run``, ``create``, ``build``, also as
        ``container run``...: every front's runs, and the CLI's passthrough) with what keeps the engine's
        state out of them (``statebinds``: the user's own /dev/shm for one that would share the host's;
        InvalidInput, in one line, for a bind that would reach that state); any other command as it is."""
        at = 2 if words[:1] in (["container"], ["image"]) else 1
        if len(words) < at or words[at - 1] not in STATE_GUARDED:
            return words
        table = self.options(words[at - 1])
        options = split_at_image(words[at:], table)[0]
        return [*words[:at], *guard(self.config, option_values(options, table), self.env), *words[at:]]

    def run_command(self, args: Sequence[str], module_args: Sequence[str] = (), subcommand: str = "run") -> list[str]:
        """``podman run`` with the site defaults and modules before the user's options."""
        self.ensure_hooks()
        return self.command(subcommand, *self.run_defaults(), *module_args, *args)

    def exec_command(self, container: str, command: Sequence[str], options: Sequence[str] = ()) -> list[str]:
        """``podman exec [options] CONTAINER COMMAND...``."""
        return self.command("exec", *options, container, *command)

    def remove_command(self, *names: str) -> list[str]:
        """``podman rm`` that stops the containers at once and ignores those already gone."""
        return self.command("rm", "--force", "--ignore", "--time", "0", *names)

    def help_command(self, subcommand: str | None = None) -> list[str]:
        """``podman [SUBCOMMAND] --help`` (help needs no storage settings)."""
        return [self.config.podman_bin, *([subcommand] if subcommand else []), "--help"]

    # --- running ----------------------------------------------------------

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        input: str | None = None,
        timeout: float | None = None,
        capture: bool = True,
    ) -> subprocess.CompletedProcess:
        """Run a podman command line; a failure raises PodmanError with podman's message."""
        try:
            result = commands.run(
                argv,
                env=self.env,
                input=input,
                timeout=timeout,
                text=True,
                stdout=subprocess.PIPE if capture else None,
                stderr=subprocess.PIPE if capture else None,
            )
        except FileNotFoundError:
            raise PodmanError(f"podman not found: {argv[0]} (set podman_bin in the site configuration)", 127)
        if check and result.returncode != 0:
            raise PodmanError(
                error_message(result.stderr or "", argv),
                result.returncode,
                (result.stdout or "") + (result.stderr or ""),
            )
        return result

    def __call__(self, subcommand: str | Sequence[str], *args: str, **kwargs) -> subprocess.CompletedProcess:
        squashed = kwargs.pop("squashed", None)
        return self.run(self.command(subcommand, *args, squashed=squashed), **kwargs)

    def remove_containers(self, *names: str) -> subprocess.CompletedProcess | None:
        """Remove containers now, whatever their state; ones already gone are no error."""
        return self.run(self.remove_command(*names), check=False) if names else None

    def popen(self, argv: Sequence[str], **kwargs) -> subprocess.Popen:
        """Start podman (``argv`` from ``command``) through the command builder, with this user's
        environment unless ``env`` is given; PodmanError (127) when the podman binary is missing."""
        kwargs.setdefault("env", self.env)
        try:
            return commands.popen(argv, **kwargs)
        except FileNotFoundError:
            raise PodmanError(f"podman not found: {argv[0]} (set podman_bin in the site configuration)", 127)

    # --- hooks --------------------------------------------------------------

    def ensure_hooks(self) -> None:
        """The hooks.d entry that runs our OCI hook for annotated containers."""
        c = self.config
        if not c.use_default_args:
            return
        spec = {
            "version": "1.0.0",
            "hook": {"path": c.hook_tool, "args": [os.path.basename(c.hook_tool)]},
            "when": {"annotations": {HOOK_ANNOTATION: "true"}},
            "stages": ["prestart"],
        }
        path = Path(c.hooks_dir) / HOOK_FILE
        text = json.dumps(spec, indent=4)
        try:
            if path.read_text() == text:
                return
        except OSError:
            pass
        if path.exists() and not os.access(path, os.W_OK):
            return  # a site-managed hooks directory
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, text)

    # --- option tables ------------------------------------------------------

    def options(self, subcommand: str) -> dict[str, bool]:
        """Flags of ``podman <subcommand>`` (long and short) -> whether they take a value.

        Read from podman's --help once per podman binary and cached in the run root.
        """
        binary = self.config.podman_bin
        resolved = shutil.which(binary, path=self.env.get("PATH", os.defpath)) or binary
        try:
            st = os.stat(resolved)
            key = f"{st.st_ino}-{int(st.st_mtime)}-{st.st_size}"
        except OSError:
            key = "unknown"
        cache = Path(self.config.run_root) / "podman-options" / f"{subcommand}-{key}.json"
        try:
            return json.loads(cache.read_text())
        except (OSError, ValueError):
            pass
        table = parse_options(self.run(self.help_command(subcommand)).stdout)
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(cache, json.dumps(table))
        except OSError:
            pass
        return table


_HELP_LINE = re.compile(r"^\s+(?:(-\w), )?(--[\w-]+)( \S+)?(?:\s{2,}|$)")


def _sees_squashed(subcommand: str, words: Sequence[str]) -> bool:
    """Whether a podman command may see the squashed stores (not one that writes images or reads
    layer contents, ``WITHOUT_SQUASHED``, alone or with its second word)."""
    pair = " ".join([subcommand, *words[1:2]])
    return subcommand not in WITHOUT_SQUASHED and pair not in WITHOUT_SQUASHED


def _flags(*pairs: tuple[str, str]) -> list[str]:
    """``flag value`` for each pair whose value is set, in order."""
    return [word for flag, value in pairs if value for word in (flag, value)]


def parse_options(help_text: str) -> dict[str, bool]:
    """Flags (short and long) -> takes a value, from podman's --help text."""
    options: dict[str, bool] = {}
    for line in help_text.splitlines():
        match = _HELP_LINE.match(line)
        if match:
            for flag in filter(None, (match.group(1), match.group(2))):
                options[flag] = bool(match.group(3))
    return options


def split_at_image(
    args: Sequence[str], options: Mapping[str, bool], flags: Iterable[str] = ()
) -> tuple[list[str], str | None, list[str]]:
    """Split ``[options] IMAGE [COMMAND...]`` into (options, image, command).

    ``options`` is podman's option table; ``flags`` are extra boolean flags
    (our module flags) accepted among the options.
    """
    booleans = set(flags)
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        i += 2 if arg not in booleans and takes_next_word(arg, options) else 1
    before = list(args[:i])
    if before and before[-1] == "--":
        before.pop()
    if i >= len(args):
        return before, None, []
    return before, args[i], list(args[i + 1 :])


def takes_next_word(arg: str, options: Mapping[str, bool]) -> bool:
    """Whether podman reads the word after the option ``arg`` as its value: a flag that takes one,
    given without ``=``, or grouped short flags that end in one (``-iv /a:/b``; not ``-eFOO``)."""
    if "=" in arg:
        return False
    if options.get(arg):
        return True
    return (
        not arg.startswith("--")
        and len(arg) > 2
        and bool(options.get(f"-{arg[-1]}"))
        and not any(options.get(f"-{letter}") for letter in arg[1:-1])
    )


def group_options(args: Sequence[str], options: Mapping[str, bool]) -> list[list[str]]:
    """Options as groups: a flag with its value (``["-e", "X=1"]``, ``["-eX=1"]``, ``["-it"]``, ``["-iv", "A:B"]``)."""
    groups: list[list[str]] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if takes_next_word(arg, options) and i + 1 < len(args):
            groups.append([arg, args[i + 1]])
            i += 2
        else:
            groups.append([arg])
            i += 1
    return groups


def split_short_flags(groups: list[list[str]], table: Mapping[str, bool]) -> list[list[str]]:
    """Grouped short flags as podman reads them: ``-it`` -> ``-i``, ``-t``; ``-eA=1`` and ``-e=A=1`` -> ``-e A=1``;
    ``-iv A:B`` -> ``-i``, ``-v A:B``."""
    split: list[list[str]] = []
    for group in groups:
        word = group[0]
        if word.startswith("--") or len(word) <= 2 or not word.startswith("-"):
            split.append(group)
            continue
        letters = word[1:]
        for i, letter in enumerate(letters):
            if table.get(f"-{letter}") and i + 1 < len(letters):
                split.append([f"-{letter}", letters[i + 1 :].removeprefix("=")])  # -v=A:B is -v A:B
                break
            split.append([f"-{letter}"])
        else:
            split[-1] += group[1:]  # the word after the group is its last flag's value
    return split


def option_values(options: Sequence[str], table: Mapping[str, bool]) -> list[tuple[str, str]]:
    """``(flag, value)`` of each option as podman reads it (``-vA:B``, ``--volume=A:B`` and
    ``["-v", "A:B"]``: ``("-v"|"--volume", "A:B")``); a flag that takes no value has ''."""
    pairs = []
    for group in split_short_flags(group_options(options, table), table):
        name, given, value = group[0].partition("=")
        pairs.append((name, value if given else (group[1] if len(group) > 1 else "")))
    return pairs


def flag_name(group: Sequence[str]) -> str:
    """The option name of one grouped option (``--env=A=1`` and ``["--env", "A=1"]``: ``--env``)."""
    return group[0].split("=", 1)[0]


def error_message(stderr: str, argv: Sequence[str] = ()) -> str:
    """podman's own error line, without its "Error: " prefix."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    line = (errors or lines or [f"podman {' '.join(argv[1:3])} failed"])[-1]
    return line.removeprefix("Error:").strip()
