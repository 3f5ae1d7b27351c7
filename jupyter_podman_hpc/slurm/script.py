"""Rendering a JobSpec as the batch script a user would write by hand.

The script is plain bash: ``#SBATCH`` lines, ``export`` lines, then one
``srun`` step that calls the node-level launcher (``podman-hpc shared-run``
in podman-exec mode, ``podman-hpc run --rm`` per process). Every value is
quoted with ``shlex.quote``; the spec has already refused newlines, NULs and
unknown directives. The script runs from a terminal with ``sbatch job.sh``
exactly as written.

The ranks see the job directory read-only and write only its ``out/`` (their
working directory, unless the spec names one): the image is untrusted, and
what the host later runs or reads (the script, the record, a notebook's
runner and plan) must not be writable from inside. Slurm writes the ranks'
logs beside them, on the host.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ..engine.site.config import SiteConfig, load_config
from ..engine.site.modules import ModuleSet
from ..version import __version__
from .spec import SRUN_MPI, JobSpec, JobSpecError, _no_breaks

BATCH_LOG = "slurm-%j.out"
RANK_OUT = "rank-%t.out"
RANK_ERR = "rank-%t.err"
OUT_DIR = "out"  # the one directory of a job its ranks may write
PYTHON = ["python3", "-u"]


@dataclass(frozen=True)
class RunTarget:
    """What each rank runs inside the container, once the inputs are in the job directory."""

    argv: tuple[str, ...]
    kind: str = "command"  # command, python_script, notebook
    note: str = ""  # a comment line for the script, e.g. how a notebook runs
    finish: tuple[str, ...] = ()  # run on the batch host after the step with its exit code (a notebook's):
    #                                never a file of the job directory, which the ranks could have written


def podman_hpc_dir() -> str | None:
    """The directory of the ``podman-hpc`` console script that belongs to this Python.

    The one beside the interpreter (the same virtual environment as the engine
    writing the script), else the first on PATH; None if there is none.
    """
    sibling = Path(sys.executable).parent / "podman-hpc"
    if sibling.is_file() and os.access(sibling, os.X_OK):
        return str(sibling.parent)
    found = shutil.which("podman-hpc")
    return str(Path(found).parent) if found else None


def default_target(spec: JobSpec, job_dir: str) -> RunTarget:
    """The run target of a spec whose inputs have their default names in the job directory."""
    if spec.command is not None:
        return RunTarget(tuple(spec.command))
    if spec.python_script:
        path = str(PurePosixPath(job_dir) / PurePosixPath(spec.python_script).name)
        return RunTarget((*PYTHON, path, *spec.args), "python_script")
    runner = str(PurePosixPath(job_dir) / "nbrunner.py")
    plan = str(PurePosixPath(job_dir) / "nbrun" / "plan.json")
    return RunTarget((*PYTHON, runner, plan, *spec.args), "notebook", finish=finish_argv(plan))


def out_dir(job_dir: str) -> str:
    """The job's output directory: the one its ranks may write."""
    return str(PurePosixPath(job_dir) / OUT_DIR)


def finish_argv(plan: str) -> tuple[str, ...]:
    """The notebook runner's finish after the step, on the batch host, run from this installed package.

    The interpreter is this one (absolute): it has this package at the version that wrote the plan,
    and lives in the environment whose podman-hpc the script runs (``podman_hpc_dir``), which the
    nodes must see too; a ``python3`` found on PATH may be another. ``-I``: the job directory (the
    script's working directory), PYTHONPATH and the user's site-packages stay out of ``sys.path``.
    """
    return (sys.executable, "-I", "-m", f"{__package__}.nbrunner", "--finish", plan)


def _quote(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(word)) for word in words)


def directives(spec: JobSpec, job_dir: str) -> list[str]:
    """The ``#SBATCH`` options, in the order a person would write them."""
    options = [
        f"--job-name={spec.default_job_name()}",
        f"--nodes={spec.nodes}",
        f"--ntasks-per-node={spec.tasks_per_node}",
    ]
    if spec.cpus_per_task:
        options.append(f"--cpus-per-task={spec.cpus_per_task}")
    if spec.gpus_per_node:
        options.append(f"--gpus-per-node={spec.gpus_per_node}")
    if spec.time:
        options.append(f"--time={spec.time}")
    for name in ("partition", "account", "qos", "reservation"):
        value = getattr(spec, name)
        if value:
            options.append(f"--{name}={value}")
    options.append(f"--chdir={shlex.quote(job_dir)}")
    options.append(f"--output={shlex.quote(f'{job_dir}/{BATCH_LOG}')}")
    options.extend(spec.extra_directives)
    return options


def _launcher_parts(
    spec: JobSpec, job_dir: str, target: RunTarget, modules: ModuleSet, config: SiteConfig
) -> tuple[list[str], list[str]]:
    chosen = spec.check_modules(modules)
    argv = ["podman-hpc"]
    argv += ["shared-run"] if spec.mode == "podman-exec" else ["run", "--rm"]
    argv += [module.flag for module in chosen]
    if spec.mode == "per-process":
        # shared-run gives every rank its Slurm/PMI variables (shared_run_exec_args);
        # a container per rank gets the same ones here.
        argv += list(config.shared_run_exec_args)
    for name in spec.environment:
        argv += ["-e", name]
    out = out_dir(job_dir)
    argv += ["-v", f"{job_dir}:{job_dir}:ro", "-v", f"{out}:{out}", "-w", spec.workdir or out]
    return argv, [spec.image, *target.argv]


def srun_argv(spec: JobSpec, job_dir: str, modules: ModuleSet) -> list[str]:
    """The srun command of a job's batch script: the MPI plugin its modules ask for, the cpus per task
    again, each rank's output and error to its own file in ``job_dir``."""
    argv = ["srun"]
    for module in spec.check_modules(modules):
        if module.name in SRUN_MPI:
            argv.append(f"--mpi={SRUN_MPI[module.name]}")
    # srun inherits the allocation's shape; --cpus-per-task must be repeated (Slurm >= 22.05).
    if spec.cpus_per_task:
        argv.append(f"--cpus-per-task={spec.cpus_per_task}")
    argv += [f"--output={job_dir}/{RANK_OUT}", f"--error={job_dir}/{RANK_ERR}"]
    return argv


def _checked_job_dir(job_dir: str | os.PathLike) -> str:
    job_dir = str(job_dir)
    _no_breaks("job directory", job_dir)
    if not os.path.isabs(job_dir):
        raise JobSpecError(f"the job directory must be an absolute path, not {job_dir!r}")
    return job_dir


def _check_target(target: RunTarget) -> None:
    for word in (*target.argv, *target.finish):
        _no_breaks("command", word)
    _no_breaks("note", target.note)


def _checked_bin_dir(bin_dir: str | None) -> str | None:
    """``bin_dir``, found as ``podman_hpc_dir`` does when "auto"."""
    if bin_dir == "auto":
        bin_dir = podman_hpc_dir()
    if bin_dir is not None:
        _no_breaks("podman-hpc directory", bin_dir)
    return bin_dir


def _header_lines(spec: JobSpec, job_dir: str, target: RunTarget) -> list[str]:
    """The shebang, the ``#SBATCH`` lines and the comments saying what the job is."""
    lines = ["#!/bin/bash"]
    lines += [f"#SBATCH {option}" for option in directives(spec, job_dir)]
    lines += [
        "",
        f"# Written by jupyter-podman-hpc {__version__}: {spec.nodes} node(s) x {spec.tasks_per_node} "
        f"task(s), {spec.mode} mode. Submit it again with: sbatch {shlex.quote(job_dir + '/job.sh')}",
    ]
    lines.append(
        f"# Every rank sees this directory read-only and may write only {out_dir(job_dir)}/, "
        f"{'its working directory' if not spec.workdir else 'and works in ' + spec.workdir}."
    )
    if target.note:
        lines.append(f"# {target.note}")
    return lines


def _path_lines(bin_dir: str | None) -> list[str]:
    if bin_dir is None:
        return []
    return [
        "",
        "# podman-hpc of the Python environment that wrote this script, first on PATH: sbatch",
        "# passes the submitter's environment to the job, but a shell (or a Jupyter server)",
        "# without that environment on its PATH may submit this script too, and every node",
        "# then runs the same podman-hpc as the login node.",
        f'export PATH={shlex.quote(bin_dir)}:"$PATH"',
    ]


def _environment_lines(spec: JobSpec) -> list[str]:
    if not spec.environment:
        return []
    return [
        "",
        "# The job's environment: seen by podman-hpc on the nodes and passed into the containers.",
        *(f"export {name}={shlex.quote(value)}" for name, value in spec.environment.items()),
    ]


def _step_lines(spec: JobSpec, job_dir: str, target: RunTarget, modules: ModuleSet, config: SiteConfig) -> list[str]:
    """The srun step: srun's options, the launcher's, then the image and what each rank runs."""
    srun = srun_argv(spec, job_dir, modules)
    options, image_and_command = _launcher_parts(spec, job_dir, target, modules, config)
    return ["", _quote(srun) + " \\", "    " + _quote(options) + " \\", "    " + _quote(image_and_command)]


def _finish_lines(target: RunTarget) -> list[str]:
    if not target.finish:
        return []
    return [
        "status=$?",
        "# Every rank's end into the output notebook, by this package's runner (not the job",
        "# directory's copy, which the ranks ran): it reads what they wrote as data.",
        _quote(target.finish) + ' "$status" || true',
        'exit "$status"',
    ]


def render(
    spec: JobSpec,
    job_dir: str | os.PathLike,
    *,
    target: RunTarget | None = None,
    modules: ModuleSet | None = None,
    config: SiteConfig | None = None,
    bin_dir: str | None = "auto",
) -> str:
    """The batch script of ``spec`` for a job directory (on storage every node sees).

    ``target`` is what each rank runs (default: the spec's command, or its
    script/notebook under its default name in the job directory). ``modules``
    and ``config`` default to the site's. ``bin_dir`` is the directory put first
    on PATH for ``podman-hpc`` ("auto": found as ``podman_hpc_dir`` does; None:
    rely on the submitter's PATH).
    """
    job_dir = _checked_job_dir(job_dir)
    if config is None:
        config = load_config()
    if modules is None:
        modules = ModuleSet.load(config.modules_dir)
    target = target or default_target(spec, job_dir)
    _check_target(target)
    bin_dir = _checked_bin_dir(bin_dir)
    lines = [
        *_header_lines(spec, job_dir, target),
        *_path_lines(bin_dir),
        *_environment_lines(spec),
        *_step_lines(spec, job_dir, target, modules, config),
        *_finish_lines(target),
        "",
    ]
    return "\n".join(lines)
