"""How a container run is planned, once for every front.

Every front that runs a container (the CLI's ``run``/``shared-run``, the
``%podman_hpc run`` magic, the kernel provisioner) does the same: load the
site (configuration, podman with its HPC settings, the modules), split the
user's words into podman options, module flags, image and command, turn the
chosen modules into podman arguments, and build the ``podman run`` command
line. ``Site.load`` and ``Site.plan`` do it; the front then runs the argv its
own way (exec, streamed into a cell, a kernel process, the launcher).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .. import reference
from ..podman import Podman, split_at_image
from ..site.config import SiteConfig, load_config
from ..site.modules import Module, ModuleSet


@dataclass
class RunPlan:
    """A parsed ``[options] [module flags] IMAGE [COMMAND...]``, with the modules' podman arguments."""

    options: list[str]  # podman run options (module and front flags removed)
    image: str | None  # normalised (no transport prefix); None when the words name none
    command: list[str]
    modules: list[Module]  # chosen, checked for conflicts and dependencies
    module_args: list[str]
    flags: list[str] = field(default_factory=list)  # the front's own flags that were given (``--join``)

    @property
    def shared(self) -> bool:
        """A chosen module runs one container per node (shared-run)."""
        return any(module.shared_run for module in self.modules)


@dataclass
class Site:
    """The site as one user sees it: configuration, podman, modules."""

    config: SiteConfig
    podman: Podman
    modules: ModuleSet
    environ: Mapping[str, str]

    @classmethod
    def load(
        cls,
        environ: Mapping[str, str],
        *,
        squash_dir: str | None = None,
        additional_stores: Sequence[str] = (),
        log_level: str | None = None,
    ) -> Site:
        """Everything a run needs of this site for this user: the configuration (``squash_dir``, extra
        stores and log level as given), podman and the module set."""
        config = load_config(environ, squash_dir=squash_dir)
        config.additional_stores += list(additional_stores)
        if log_level:
            config.log_level = log_level
        return cls(
            config, Podman(config, environ), ModuleSet.load(config.modules_dir, cache_dir=config.run_root), environ
        )

    def plan(self, args: Sequence[str], front_flags: Iterable[str] = ()) -> RunPlan:
        """Split ``[options] IMAGE [COMMAND...]`` and resolve the module flags among the options."""
        front_flags = list(front_flags)
        options, image, command, chosen = parse_run_args(self.podman, self.modules, args, front_flags)
        given = [o for o in options if o in front_flags]
        options = [o for o in options if o not in front_flags]
        return RunPlan(options, image, command, chosen, self.modules.podman_args(chosen, self.environ), given)

    def run_argv(self, plan: RunPlan, extra_options: Sequence[str] = ()) -> list[str]:
        """``podman run`` of the plan, with ``extra_options`` before the user's; SquashDamaged
        (one line) when the image would come from a squash file that is no whole squashfs image."""
        if plan.image:
            refuse_damaged_squash(self.config, plan.image)
        return self.podman.run_command(
            [*extra_options, *plan.options, plan.image or "", *plan.command], plan.module_args
        )


def refuse_damaged_squash(config: SiteConfig, ref: str) -> None:
    """SquashDamaged when the image podman would run for ``ref`` comes from a squashed store and
    its squash file is damaged: said in one line before podman starts (the mount program refuses
    it too, but podman wraps its line in two of its own, with the overlay's mount options).
    An image in the node-local storage is podman's to run: nothing is checked."""
    from ..errors import EngineError
    from ..images.catalog import find_squashed
    from ..store.graphroot import GraphRoot
    from ..store.squashcheck import SquashDamaged, damage

    if GraphRoot(config.graph_root).find(ref) is not None:
        return
    try:
        image = find_squashed(config, ref)
    except EngineError:
        return  # podman says what is wrong with the store
    if image is None or not image.squash_file:
        return
    try:
        fd = os.open(image.squash_file, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return
    try:
        why = damage(fd)
    finally:
        os.close(fd)
    if why:
        raise SquashDamaged(image.squash_file, why)


# shared-run's own flags: how the task enters the node's container (they beat shared_run_exec_mode),
# and whether the job's later steps use the node's container again (they beat shared_run_reuse)
JOIN_FLAGS = ("--join", "--no-join")
REUSE_FLAGS = ("--reuse", "--no-reuse")
SHARED_RUN_FLAGS = JOIN_FLAGS + REUSE_FLAGS


def wants_join(flags: Sequence[str], mode: str) -> bool:
    """Whether a task joins the container (the last of ``--join``/``--no-join`` given, else ``mode``)."""
    given = [flag for flag in flags if flag in JOIN_FLAGS]
    return given[-1] == "--join" if given else mode == "join"


def wants_reuse(flags: Sequence[str], setting: bool) -> bool:
    """Whether the step leases its job's container (the last of ``--reuse``/``--no-reuse`` given, else
    the ``shared_run_reuse`` setting)."""
    given = [flag for flag in flags if flag in REUSE_FLAGS]
    return given[-1] == "--reuse" if given else setting


def parse_run_args(
    podman: Podman, modules: ModuleSet, args: Sequence[str], extra_flags: Sequence[str] = SHARED_RUN_FLAGS
) -> tuple[list[str], str | None, list[str], list[Module]]:
    """``[options] IMAGE [COMMAND...]``: (podman options with ``extra_flags`` kept, image, command,
    chosen modules). Module flags (``--gpu``, ``--openmpi-pmix``...) are told apart from podman's
    own run options; the modules are checked for conflicts and dependencies."""
    flags = modules.by_flag()
    options, image, command = split_at_image(args, podman.options("run"), [*flags, *extra_flags])
    chosen = modules.select([flags[o].name for o in options if o in flags])
    options = [o for o in options if o not in flags]
    return options, reference.normalize(image) if image else None, command, chosen
