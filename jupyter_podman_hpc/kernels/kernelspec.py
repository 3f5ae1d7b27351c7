"""Kernelspecs of container kernels: install, list and remove, and which may start by themselves.

A kernelspec written here is a standard Jupyter kernelspec directory
(``kernel.json`` and the logo) whose ``metadata.kernel_provisioner``
selects ``podman-hpc-provisioner`` with the image and modules. By default
it goes to the user's Jupyter data directory (``jupyter --data-dir``),
where JupyterLab, notebook servers and JupyterHub single-user servers all
look. Writes are atomic: the directory is assembled beside the kernels
directory and renamed into place (swapped with the old one when replacing),
under a lock, so Jupyter never lists a half-written kernelspec.
Only a kernelspec that nobody but the user and root could have written
starts ahead of need (``check_trusted``); one that a project member could
plant in a shared kernels directory starts only when the user picks it.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from jupyter_core.paths import SYSTEM_JUPYTER_PATH, jupyter_data_dir, jupyter_path

from ..engine.base.locks import flocked
from ..engine.base.private import UnsafeDirectory, trusted_file
from ..engine.errors import EngineError, NotFound
from ..version import __version__
from . import PROVISIONER_NAME

KERNEL_ARGV = ["{python}", "-m", "ipykernel_launcher", "-f", "{connection_file}"]
LOGO_FILES = ("logo-svg.svg", "logo-64x64.png", "logo-32x32.png")
MAX_NAME = 128
MAX_POOL = 16  # pooled kernels per kernelspec and server process
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_LOCK_NAME = ".podman-hpc-kernels.lock"


class KernelSpecError(EngineError):
    """A kernelspec cannot be installed, found or removed."""

    exit_code = 1


class KernelNotFound(KernelSpecError, NotFound):
    """No podman-hpc kernelspec has that name."""


@dataclass(frozen=True)
class ContainerKernel:
    """A podman-hpc kernelspec as found on disk."""

    name: str
    display_name: str
    image: str
    modules: list[str] = field(default_factory=list)
    podman_args: list[str] = field(default_factory=list)
    path: str = ""
    pool: int | None = None  # kernels kept started ahead of need (None: the server's default)
    slurm: bool = True  # the site's slurm module (the host's Slurm inside the kernel)

    def as_dict(self) -> dict:
        """The kernel's fields as JSON-ready data (``kernel list --json``, the server)."""
        return asdict(self)


# --- names and locations ---------------------------------------------------------


def validate_name(name: str) -> str:
    """``name`` if Jupyter and we accept it as a kernel name, else KernelSpecError."""
    if not isinstance(name, str) or not _NAME.match(name) or len(name) > MAX_NAME:
        raise KernelSpecError(
            f"invalid kernel name {name!r}: use lower-case letters, digits, '.', '_' and '-' "
            f"(starting with a letter or digit, at most {MAX_NAME} characters)"
        )
    return name


def default_name(image: str) -> str:
    """``podman-hpc-<image>`` with the reference's other characters turned into '-'."""
    slug = re.sub(r"[^a-z0-9._-]+", "-", image.lower()).strip("-._")
    return f"podman-hpc-{slug}"[:MAX_NAME].rstrip("-._")


def default_display_name(image: str) -> str:
    """The name the launcher shows for a kernel of ``image`` when none is given."""
    return f"Python (podman-hpc: {image})"


def kernels_dir(*, user: bool = True, sys_prefix: bool = False, prefix: str | os.PathLike | None = None) -> Path:
    """Where ``install`` writes: ``prefix``, else ``sys.prefix``, else the user's data dir,
    else the system-wide directory."""
    if prefix is not None:
        return Path(prefix) / "share" / "jupyter" / "kernels"
    if sys_prefix:
        return Path(sys.prefix) / "share" / "jupyter" / "kernels"
    if user:
        return Path(jupyter_data_dir()) / "kernels"
    return Path(SYSTEM_JUPYTER_PATH[0]) / "kernels"


def search_dirs(prefix: str | os.PathLike | None = None) -> list[Path]:
    """The kernels directories Jupyter searches (``JUPYTER_PATH``, user, env, system), in its order."""
    dirs = [Path(d) for d in jupyter_path("kernels")]
    if prefix is not None:
        extra = kernels_dir(prefix=prefix)
        if extra not in dirs:
            dirs.insert(0, extra)
    return dirs


def _logo_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    # a wheel carries the repository's kernels/ folder as package data;
    # an editable install reads it from the checkout
    return [here / "resources", here.parents[1] / "kernels"]


def logo_files() -> dict[str, bytes]:
    """The kernel logos to install with a kernelspec (file name to bytes), from the package data or the
    checkout; {} when neither has them."""
    for directory in _logo_dirs():
        found = {name: (directory / name).read_bytes() for name in LOGO_FILES if (directory / name).is_file()}
        if found:
            return found
    return {}


# --- kernel.json -----------------------------------------------------------------


def kernel_json(
    image: str,
    *,
    display_name: str | None = None,
    modules: Sequence[str] = (),
    podman_args: Sequence[str] = (),
    python: str = "python3",
    interrupt_mode: str = "message",
    pool: int | None = None,
    slurm: bool = True,
) -> dict:
    """The kernel.json of a container kernel."""
    config: dict = {"image": image}
    if modules:
        config["modules"] = list(modules)
    if podman_args:
        config["podman_args"] = list(podman_args)
    if pool is not None:
        config["pool"] = pool
    if not slurm:
        config["slurm"] = False
    return {
        "argv": [python if arg == "{python}" else arg for arg in KERNEL_ARGV],
        "display_name": display_name or default_display_name(image),
        "language": "python",
        "interrupt_mode": interrupt_mode,
        # debugpy in the image warns about frozen modules on every start otherwise
        "env": {"PYDEVD_DISABLE_FILE_VALIDATION": "1"},
        "metadata": {
            "kernel_provisioner": {"provisioner_name": PROVISIONER_NAME, "config": config},
            "podman_hpc": {"image": image, "installed_by": f"jupyter-podman-hpc {__version__}"},
        },
    }


class BrokenKernelSpec(KernelSpecError):
    """A kernel.json that cannot be read, or one of ours whose fields make no sense; ``str()``
    names the file and what is wrong, in one line."""


def _read(directory: Path) -> ContainerKernel | None:
    """The kernelspec in ``directory`` if it is one of ours; None for another kind of kernel.
    BrokenKernelSpec when its kernel.json is not JSON, not an object, or ours with malformed fields."""
    path = directory / "kernel.json"
    spec = _json_object(path)
    provisioner = _our_provisioner(spec)
    if provisioner is None:
        return None
    config = provisioner.get("config") or {}
    problem = _config_problem(config)
    if problem:
        raise BrokenKernelSpec(
            f"kernelspec {path}: {problem}: install it again (jupyter podman-hpc kernel install) or remove it"
        )
    return _container_kernel(directory, spec, config)


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; BrokenKernelSpec when it cannot be read, is not JSON or not an object."""
    try:
        spec = json.loads(path.read_text())
    except OSError as err:
        raise BrokenKernelSpec(f"kernelspec {path} cannot be read: {err.strerror or err}")
    except ValueError as err:
        raise BrokenKernelSpec(f"kernelspec {path} is not valid JSON{_json_error_place(err)}: fix or remove it")
    if not isinstance(spec, dict):
        raise BrokenKernelSpec(f"kernelspec {path} is not a JSON object: fix or remove it")
    return spec


def _json_error_place(err: ValueError) -> str:
    """Where in the file a JSON error is (`` (line L, column C)``), or '' for an error that does not say."""
    return f" (line {err.lineno}, column {err.colno})" if isinstance(err, json.JSONDecodeError) else ""


def _our_provisioner(spec: dict) -> dict | None:
    """The kernel_provisioner object of a kernelspec if it names ours; None for another kind of kernel."""
    metadata = spec.get("metadata") or {}
    provisioner = metadata.get("kernel_provisioner") if isinstance(metadata, dict) else None
    if isinstance(provisioner, dict) and provisioner.get("provisioner_name") == PROVISIONER_NAME:
        return provisioner
    return None


def _container_kernel(directory: Path, spec: dict, config: dict) -> ContainerKernel:
    """The kernel that one of our kernelspecs describes (its provisioner config already checked)."""
    return ContainerKernel(
        name=directory.name,
        display_name=str(spec.get("display_name", "")),
        image=config["image"],
        modules=[str(m) for m in config.get("modules") or []],
        podman_args=[str(a) for a in config.get("podman_args") or []],
        path=str(directory),
        pool=config["pool"] if isinstance(config.get("pool"), int) else None,
        slurm=config.get("slurm") is not False,
    )


def _config_problem(config) -> str:
    """What is wrong with a podman-hpc kernelspec's provisioner config, or ''."""
    if not isinstance(config, dict):
        return "metadata.kernel_provisioner.config is not an object"
    if not isinstance(config.get("image"), str) or not config["image"]:
        return "it names no image (metadata.kernel_provisioner.config.image)"
    for key in ("modules", "podman_args"):
        if not isinstance(config.get(key) or [], list):
            return f"metadata.kernel_provisioner.config.{key} is not a list"
    return ""


def _ours(directory: Path) -> bool:
    """Whether ``directory`` holds one of our kernelspecs (a broken one counts: ours to replace)."""
    try:
        return _read(directory) is not None
    except BrokenKernelSpec:
        return True


# --- writing -----------------------------------------------------------------------


def _locked(kernels: Path):
    """Serialise installs and removals in one kernels directory (across processes and threads)."""
    return flocked(kernels.parent / _LOCK_NAME)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two directories (renameat2 RENAME_EXCHANGE); False if unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if result == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(error, os.strerror(error), str(b))


def _stage(kernels: Path, name: str, files: dict[str, bytes]) -> Path:
    """A complete kernelspec directory beside the kernels directory (where Jupyter does not look)."""
    staging = Path(tempfile.mkdtemp(prefix=f".podman-hpc-kernel-{name}.", dir=kernels.parent))
    try:
        for filename, data in files.items():
            with open(staging / filename, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(staging / filename, 0o644)
        os.chmod(staging, 0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def _put(staging: Path, target: Path) -> None:
    """Move the staged directory to ``target``, replacing what is there in one step."""
    if not target.exists():
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging, ignore_errors=True)  # it holds the old kernelspec now
        return
    old = staging.with_name(staging.name + ".old")
    os.rename(target, old)
    os.rename(staging, target)
    shutil.rmtree(old, ignore_errors=True)


def _check_modules(modules: Sequence[str]) -> None:
    """The modules exist in the site configuration and go together."""
    if not modules:
        return
    from ..engine.site.config import load_config
    from ..engine.site.modules import ModuleSet

    config = load_config(os.environ)
    ModuleSet.load(config.modules_dir).select(modules)


def install(
    image: str,
    name: str | None = None,
    display_name: str | None = None,
    modules: Iterable[str] = (),
    *,
    user: bool = True,
    sys_prefix: bool = False,
    prefix: str | os.PathLike | None = None,
    podman_args: Iterable[str] = (),
    python: str = "python3",
    interrupt_mode: str = "message",
    pool: int | None = None,
    slurm: bool = True,
) -> ContainerKernel:
    """Write (or replace) the kernelspec of a container kernel; returns it as installed.

    A kernelspec of the same name that is not a podman-hpc kernel is never replaced.
    """
    from ..engine import reference

    image = reference.validate(image)
    name = validate_name(name if name is not None else default_name(image))
    modules = list(modules)
    podman_args = [str(a) for a in podman_args]
    _check_options(display_name=display_name, interrupt_mode=interrupt_mode, python=python, pool=pool)
    _check_modules(modules)
    spec = kernel_json(
        image,
        display_name=display_name,
        modules=modules,
        podman_args=podman_args,
        python=python,
        interrupt_mode=interrupt_mode,
        pool=pool,
        slurm=slurm,
    )
    files = {"kernel.json": (json.dumps(spec, indent=1) + "\n").encode(), **logo_files()}
    kernels = kernels_dir(user=user, sys_prefix=sys_prefix, prefix=prefix)
    installed = _read(_write(kernels, name, files))
    assert installed is not None
    return installed


# install's options: (name, message, whether a value is refused), checked in this order. A message
# may name the value ({!r}).
_OPTION_CHECKS = (
    (
        "display_name",
        "the display name must be one non-empty line of at most 200 characters",
        lambda value: value is not None and (not value.strip() or "\n" in value or len(value) > 200),
    ),
    (
        "interrupt_mode",
        "interrupt mode must be 'message' or 'signal', not {!r}",
        lambda value: value not in ("message", "signal"),
    ),
    ("python", "invalid python command {!r} for the image", lambda value: not value or any(c.isspace() for c in value)),
    (
        "pool",
        f"the pool size must be a whole number from 0 to {MAX_POOL}, not {{!r}}",
        lambda value: (
            value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_POOL)
        ),
    ),
)


def _check_options(**options) -> None:
    for name, message, refused in _OPTION_CHECKS:
        if refused(options[name]):
            raise KernelSpecError(message.format(options[name]))


def _write(kernels: Path, name: str, files: dict[str, bytes]) -> Path:
    """The kernelspec ``name`` written into ``kernels`` in one step, under the directory's lock;
    a kernelspec of that name that is not a podman-hpc kernel is never replaced."""
    target = kernels / name
    try:
        kernels.mkdir(parents=True, exist_ok=True)
        with _locked(kernels):
            if target.exists() and not _ours(target):
                raise KernelSpecError(
                    f"a kernel named {name} that is not a podman-hpc kernel exists in {kernels}: choose another --name"
                )
            staging = _stage(kernels, name, files)
            try:
                _put(staging, target)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
    except OSError as err:
        raise KernelSpecError(f"cannot write the kernelspec {name} to {kernels}: {err.strerror or err}")
    return target


def list_kernels(prefix: str | os.PathLike | None = None, problems: list[str] | None = None) -> list[ContainerKernel]:
    """The podman-hpc kernelspecs Jupyter sees, one per name (the one Jupyter would use).

    A kernel.json that cannot be read (or one of ours with malformed fields) does not stop the
    listing: it is left out, and one line naming it and what is wrong goes to ``problems``."""
    found: dict[str, ContainerKernel] = {}
    shadowed: set[str] = set()
    for directory in search_dirs(prefix):
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            name = entry.name.lower()
            if name in found or name in shadowed or not (entry / "kernel.json").is_file():
                continue
            try:
                kernel = _read(entry)
            except BrokenKernelSpec as err:
                shadowed.add(name)  # Jupyter does not take another directory's spec of that name either
                if problems is not None:
                    problems.append(str(err))
                continue
            if kernel is None:
                shadowed.add(name)  # an ordinary kernel of that name comes first
            else:
                found[name] = kernel
    return sorted(found.values(), key=lambda k: k.name)


class UntrustedKernelSpec(KernelSpecError):
    """A kernelspec that someone other than the user and root could have written: its kernels start
    only when the user picks it, never ahead of need (a warm pool at server start)."""


def check_trusted(directory: str | os.PathLike) -> Path:
    """The kernel.json of the kernelspec in ``directory``, if only the user or root could have
    written it: the file, its directory and those above, as ``engine.base.private`` judges a site's
    hooks directory. UntrustedKernelSpec otherwise, in one line: which path, and who else may write it."""
    spec_file = Path(directory) / "kernel.json"
    try:
        return trusted_file(spec_file)
    except UnsafeDirectory as err:
        raise UntrustedKernelSpec(f"kernelspec {spec_file} starts only when picked: {err}")
    except OSError as err:
        raise UntrustedKernelSpec(
            f"kernelspec {spec_file} starts only when picked: {err.filename or spec_file}: {err.strerror or err}"
        )


def find(name: str, prefix: str | os.PathLike | None = None) -> ContainerKernel:
    """The installed podman-hpc kernel called ``name`` (in ``prefix``, or every kernel directory Jupyter
    reads); KernelNotFound otherwise, KernelSpecError for a name that is not valid."""
    validate_name(name)
    for kernel in list_kernels(prefix):
        if kernel.name == name:
            return kernel
    raise KernelNotFound(f"no podman-hpc kernel named {name} (see `jupyter podman-hpc kernel list`)")


def remove(name: str, prefix: str | os.PathLike | None = None) -> ContainerKernel:
    """Remove the kernelspec ``name`` (the one Jupyter would use); returns what was removed."""
    kernel = find(name, prefix)
    directory = Path(kernel.path)
    kernels = directory.parent
    try:
        with _locked(kernels):
            if not _ours(directory):
                raise KernelNotFound(f"no podman-hpc kernel named {name} (see `jupyter podman-hpc kernel list`)")
            doomed = Path(tempfile.mkdtemp(prefix=f".podman-hpc-kernel-{name}.", dir=kernels.parent))
            os.rename(directory, doomed / name)  # gone from Jupyter's view in one step
            shutil.rmtree(doomed, ignore_errors=True)
    except OSError as err:
        raise KernelSpecError(f"cannot remove the kernelspec {name} from {kernels}: {err.strerror or err}")
    return kernel
