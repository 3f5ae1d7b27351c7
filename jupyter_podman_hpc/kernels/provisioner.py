"""``PodmanHPCProvisioner``: Jupyter kernels that run inside podman-hpc images.

A kernelspec selects it with::

    "metadata": {"kernel_provisioner": {
        "provisioner_name": "podman-hpc-provisioner",
        "config": {"image": "registry/name:tag", "modules": ["gpu"], "podman_args": []}}}

Launching runs the kernelspec's ``argv`` (the image's ipykernel) with
``podman-hpc run`` semantics, through the engine's ``Podman`` command
builder: the site's storage settings and squashed store, the site modules
named in ``modules`` (and ``slurm`` where the host has Slurm: ``slurm``
false opts out; ``engine/site/hostslurm.py``). The container's command line
(network, mounts, user namespace, environment, the boot program) is
``container.py``'s, and ``spawn.py`` starts it. With a pool size (``pool``),
a start adopts a container of the kernelspec's pool (``pool.py``) when one
can serve it.

The provisioner keeps the attached ``podman run`` as the kernel's process:
it lives exactly as long as the container, so ``poll()`` is the container's
state without asking podman, and the kernel's stderr reaches the server's
log. ``launch_kernel`` returns once the kernel has opened its ports, and
fails fast, with a message for the user, when the container exits first
(image missing, no ipykernel in it, ...).

Interrupts: kernelspecs we write use ``interrupt_mode: message`` (ipykernel
signals itself inside the container); ``signal`` mode works too: SIGINT is
sent with ``podman kill --signal`` to catatonit, which forwards it.
Orphans: see ``orphans`` (a watchdog per kernel, and a sweep before the
first kernel of every process).
"""

from __future__ import annotations

import asyncio
import collections
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Bool, Float, Int, List, TraitError, Unicode, Union

from ..engine import EngineError, reference
from ..engine.podman import Podman, error_message
from ..engine.run.plan import Site
from ..engine.site import hostslurm
from ..engine.site.modules import ModuleSet
from . import kernelspec, orphans
from . import pool as pools
from .container import KernelContainer, KernelStartError, home
from .spawn import STDERR_TAIL, spawn

POLL_SECONDS = 0.01  # how often a starting kernel's heartbeat port is tried (a loopback connect)


class PodmanHPCProvisioner(LocalProvisioner):
    """Runs a kernel in a podman-hpc container (see the module's docstring)."""

    image = Unicode("", help="The image whose ipykernel runs the kernel.").tag(config=True)
    modules = List(Unicode(), help="Site modules (modules.d) to enable, by name or flag.").tag(config=True)
    podman_args = List(Unicode(), help="Extra `podman run` options, before the image.").tag(config=True)
    keep_id = Union(
        [Bool(), Unicode()],
        default_value="auto",
        help="--userns=keep-id: 'auto' (when the image runs from node-local layers), true or false.",
    ).tag(config=True)
    watchdog = Bool(True, help="Start a watchdog that removes the container if this process dies.").tag(config=True)
    init = Bool(True, help="Run catatonit as the container's PID 1 (podman run --init).").tag(config=True)
    startup_timeout = Float(120.0, help="Seconds to wait for the kernel to open its ports.").tag(config=True)
    pass_env = List(
        Unicode(),
        default_value=["JPY_*", "KERNEL_*", "TERM", "CLICOLOR", "FORCE_COLOR", "PYDEVD_*", "USER", "LOGNAME"],
        help="Variables of the kernel's environment passed into the container "
        "(names or globs), besides HOME and the kernelspec's env.",
    ).tag(config=True)
    slurm = Bool(
        True, help="Enable the site's `slurm` module (the host's Slurm inside the kernel) when this node has Slurm."
    ).tag(config=True)
    pool = Int(
        None,
        allow_none=True,
        help="Kernels of this kernelspec kept started ahead of need in this process (a warm "
        "pool); unset: c.PodmanHPC.kernel_pool, else 0.",
    ).tag(config=True)

    # The first kernel of each process sweeps orphaned containers.
    _swept = False
    _sweep_lock = threading.Lock()

    container_name: str = ""
    _program = ""  # the kernel's executable in the image
    _stderr_tail: collections.deque
    _drain: threading.Thread | None = None
    _watchdog: subprocess.Popen | None = None
    _podman: Podman | None = None
    _container: KernelContainer | None = None
    _settings: dict[str, Any]
    _lost_check = float("-inf")  # monotonic time may be below 1 s on a fresh boot
    _lost_running = False

    def __init__(self, **kwargs: Any):
        settings = set(self.class_trait_names(config=True))
        known = set(self.class_trait_names()) | {"parent", "config", "log"}
        unknown = sorted(key for key in kwargs if key not in known)
        if unknown:
            raise KernelStartError(
                f"unknown key '{unknown[0]}' in the kernelspec's kernel_provisioner config "
                f"(known keys: {', '.join(sorted(settings))})"
            )
        self._settings = {key: value for key, value in kwargs.items() if key in settings}
        try:
            super().__init__(**kwargs)
        except TraitError as err:
            raise KernelStartError(f"invalid kernel_provisioner config in the kernelspec: {err}".splitlines()[0])
        self._stderr_tail = collections.deque(maxlen=STDERR_TAIL)

    # --- starting ---------------------------------------------------------------

    def _prepare_engine(self) -> None:
        if not self.image:
            raise KernelStartError("the kernelspec names no image: set metadata.kernel_provisioner.config.image")
        try:
            self.image = reference.validate(self.image)
            site = Site.load(os.environ)
            self._podman, site_modules = site.podman, site.modules
            names = list(self.modules)
            if self._wants_slurm(site_modules, names):
                names.append(hostslurm.MODULE)  # podman_args builds its uid shim
            self._container = KernelContainer(
                self._podman,
                self.image,
                site_modules.podman_args(site_modules.select(names), os.environ),
                list(self.podman_args),
                list(self.kernel_spec.argv) if self.kernel_spec else [],
                dict(self.kernel_spec.env) if self.kernel_spec else {},
                list(self.pass_env),
                self.init,
                self.keep_id,
            )
        except EngineError as err:
            raise KernelStartError(f"cannot start a kernel in image {self.image}: {err}")

    def _wants_slurm(self, site_modules: ModuleSet, names: list[str]) -> bool:
        """The slurm module goes in unless opted out, absent from the site, or Slurm absent here."""
        if not self.slurm or not any(m.name == hostslurm.MODULE for m in site_modules):
            return False
        if any(site_modules.by_name(name).name == hostslurm.MODULE for name in names):
            return False  # named explicitly
        return hostslurm.host_has_slurm(os.environ)

    def _start_sweep(self) -> None:
        """Once per process: remove orphaned kernel containers, in the background."""
        cls = type(self)
        with cls._sweep_lock:
            if PodmanHPCProvisioner._swept:
                return
            PodmanHPCProvisioner._swept = True
        podman, log = self._podman, self.log

        def sweep() -> None:
            try:
                removed = orphans.sweep(podman)
                if removed:
                    log.info("podman-hpc: removed orphaned kernel containers: %s", ", ".join(removed))
            except Exception as err:  # noqa: BLE001  never fail a kernel start over housekeeping
                log.warning("podman-hpc: sweeping orphaned kernel containers failed: %s", err)

        threading.Thread(target=sweep, name="podman-hpc-kernel-sweep", daemon=False).start()

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Prepare the engine, sweep orphaned kernel containers once, and name this kernel's container; then
        jupyter_client's preparation (connection info, the command's arguments)."""
        self._prepare_engine()
        self._start_sweep()
        self.container_name = "podman-hpc-kernel-" + re.sub(r"[^A-Za-z0-9_.-]", "_", str(self.kernel_id))
        return await super().pre_launch(**kwargs)

    def build_command(
        self, cmd: Sequence[str], env: dict[str, str], cwd: str | None
    ) -> tuple[list[str], dict[str, str]]:
        """The ``podman run`` command line of the kernel container and podman's environment."""
        assert self._container is not None, "pre_launch was not called"
        connection_file = getattr(self.parent, "connection_file", "") if self.parent else ""
        argv, podman_env = self._container.kernel_command(
            self.container_name,
            orphans.labels(str(self.kernel_id)),
            cmd,
            env,
            cwd,
            connection_file,
            self.connection_info.get("transport", "tcp"),
        )
        self._program = self._container.argv_in_image(cmd)[0] if cmd else ""
        return argv, podman_env

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> KernelConnectionInfo:
        """Start the kernel: hand it to a pooled container that can take it, else start its own; the
        connection info once it listens."""
        assert self._podman is not None, "pre_launch was not called"
        env = dict(kwargs.get("env") or os.environ)
        cwd = kwargs.get("cwd")
        spec_file = self._pool_spec_file(cmd)
        if not await self._adopt_pooled(spec_file, cmd, env, cwd):
            self._start_own(cmd, env, cwd)
        await self._wait_until_listening()
        if spec_file is not None:
            # refilled, or made by this kernelspec's first kernel, once this kernel is up (not beside its start)
            self._refill_pool(spec_file, cwd)
        return self.connection_info

    async def _adopt_pooled(self, spec_file: Path | None, cmd: list[str], env: dict[str, str], cwd: str | None) -> bool:
        """Hand this kernel to a container of its kernelspec's pool; False if the pool has none ready or the
        one it had cannot take this kernel (that one is removed: the kernel starts on demand)."""
        assert self._podman is not None
        entry = self._take_pooled(spec_file, cwd)
        if entry is None:
            return False
        if self._hand_over(entry, cmd, env, cwd):
            self.log.info(
                "podman-hpc: kernel %s adopts pooled container %s (image %s)", self.kernel_id, entry.name, self.image
            )
            return True
        await asyncio.to_thread(self._podman.remove_containers, entry.name)
        return False

    @staticmethod
    def _take_pooled(spec_file: Path | None, cwd: str | None) -> pools.Pooled | None:
        """A ready container of this kernelspec's pool in this process, if it has one."""
        pool = pools.find(pools.spec_key(spec_file) or "") if spec_file else None
        return pool.take(cwd or home()) if pool is not None else None

    def _start_own(self, cmd: list[str], env: dict[str, str], cwd: str | None) -> None:
        """Start this kernel's own container."""
        argv, podman_env = self.build_command(cmd, env, cwd)
        self.log.info(
            "podman-hpc: starting kernel %s in %s (image %s)", self.kernel_id, self.container_name, self.image
        )
        self._attach(self._spawn(argv, podman_env, self.container_name, ()), cwd)

    def _refill_pool(self, spec_file: Path, cwd: str | None) -> None:
        """Refill this kernelspec's pool, or make it if this is its first kernel."""
        pool = self._open_pool(spec_file, cwd)
        if pool is not None:
            pool.refill()

    def _spawn(
        self, argv: Sequence[str], podman_env: dict[str, str], name: str, dirs: Sequence[str], interactive: bool = False
    ) -> pools.Pooled:
        """Start a kernel container: its ``podman run``, stderr drain and watchdog (``spawn.py``)."""
        assert self._podman is not None
        return spawn(
            self._podman,
            argv,
            podman_env,
            name,
            dirs,
            image=self.image,
            watchdog=self.watchdog,
            log=self.log,
            interactive=interactive,
        )

    def _attach(self, entry: pools.Pooled, cwd: str | None) -> None:
        """Make ``entry``'s container this kernel's."""
        self.container_name = entry.name
        self.process = entry.process
        self.pid = self.pgid = entry.process.pid
        self.cwd = cwd or home()
        self._stderr_tail, self._drain, self._watchdog = entry.tail, entry.drain, entry.watchdog
        self._lost_running = False

    # --- the warm pool (see pool.py) ---------------------------------------------------

    def _pool_size(self) -> int:
        return self.pool if self.pool is not None else pools.default_size

    def _pool_spec_file(self, cmd: Sequence[str]) -> Path | None:
        """The kernel.json of this kernel's pool, if this kernelspec keeps one in this process and it
        can serve this kernel (ipykernel's launcher, over tcp)."""
        assert self._container is not None
        if self._pool_size() <= 0 or self.kernel_spec is None:
            return None
        if not self._container.boots(self._container.argv_in_image(cmd)):
            return None
        if self.connection_info.get("transport", "tcp") != "tcp":
            return None
        return Path(getattr(self.kernel_spec, "resource_dir", "") or ".") / "kernel.json"

    def _open_pool(self, spec_file: Path, cwd: str | None) -> pools.Pool | None:
        """This kernelspec's pool in this process, made if there is none yet."""
        key = pools.spec_key(spec_file)
        if key is None:
            return None
        try:
            return pools.get(key, lambda: self._make_pool(key, self._pool_size(), spec_file, cwd))
        except EngineError as err:
            self.log.warning("podman-hpc: no kernel pool for %s: %s", key, err)
            return None

    @classmethod
    def warm(cls, kernel_name: str, spec_manager, config=None, log=None) -> pools.Pool | None:
        """Start the pool of kernelspec ``kernel_name`` now (a server at start), not at its first kernel;
        UntrustedKernelSpec, and no container, when others than the user and root could have written it
        (the kernelspec Jupyter resolves for that name, as it would start it)."""
        spec = spec_manager.get_kernel_spec(kernel_name)
        kernelspec.check_trusted(spec.resource_dir)
        settings = dict((spec.metadata.get("kernel_provisioner") or {}).get("config") or {})
        provisioner = cls(**settings, kernel_spec=spec, config=config, **({"log": log} if log else {}))
        provisioner._prepare_engine()
        spec_file = provisioner._pool_spec_file(spec.argv)
        return provisioner._open_pool(spec_file, None) if spec_file else None

    def _make_pool(self, key: str, size: int, spec_file: Path, cwd: str | None) -> pools.Pool:
        """The pool, whose containers a provisioner of its own starts (this one is its kernel's)."""
        template = type(self)(**self._settings, config=self.config, log=self.log)
        template.kernel_spec = self.kernel_spec
        template._prepare_engine()
        assert template._container is not None and self.kernel_spec is not None
        return pools.make(
            key,
            size,
            template._container,
            spec_file,
            {**os.environ, **self.kernel_spec.env},
            cwd,
            lambda argv, env, name, dirs: template._spawn(argv, env, name, dirs, interactive=True),
            self.log,
        )

    def _hand_over(self, entry: pools.Pooled, cmd: Sequence[str], env: dict[str, str], cwd: str | None) -> bool:
        """Make a pooled container this kernel (see pool.py); False if it cannot take it (the
        kernel then starts on demand)."""
        assert self._container is not None
        request = pools.adoption_request(
            self._container, getattr(self.parent, "connection_file", ""), cmd, env, cwd, self.log
        )
        if request is None:
            return False
        self._attach(entry, cwd)
        return entry.hand_over(request)

    async def _wait_until_listening(self) -> None:
        """Return once the kernel listens on its ports; raise if its container ends first."""
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.process.poll()
            if code is not None:
                if self._drain is not None:
                    await asyncio.to_thread(self._drain.join, 5)
                message = self.explain_exit(code, list(self._stderr_tail))
                self.log.error("podman-hpc: %s", message)
                await self._discard()
                raise KernelStartError(message)
            if await self._listening():
                return
            if time.monotonic() > deadline:
                await self.kill()
                await self._discard()
                raise KernelStartError(
                    f"the kernel in image {self.image} did not open its ports within "
                    f"{self.startup_timeout:.0f} s: is its argv an ipykernel? "
                    f"(last output: {' | '.join(list(self._stderr_tail)[-3:]) or 'none'})"
                )
            await asyncio.sleep(POLL_SECONDS)

    async def _listening(self) -> bool:
        info = self.connection_info
        port = info.get("hb_port")
        ip = str(info.get("ip") or "127.0.0.1")
        if not port:
            return True
        if info.get("transport", "tcp") == "ipc":
            return os.path.exists(f"{ip}-{port}")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(ip, int(port)), 1.0)
        except (TimeoutError, OSError):
            return False
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass
        return True

    def explain_exit(self, code: int, stderr: Sequence[str]) -> str:
        """One sentence for a container that ended before its kernel listened."""
        text = "\n".join(stderr)
        image = self.image
        if re.search(r"image not known|no such image|image .* not found|unable to find", text, re.I):
            return (
                f"image {image} is not on this node (neither squashed nor local): "
                f"pull it with `podman-hpc pull {image}` or choose another image"
            )
        if re.search(r"No module named '?ipykernel", text):
            return f"image {image} has no ipykernel: install it or choose another image"
        if code == 127 or re.search(r"executable file .* not found|failed to exec pid1: No such file", text):
            missing = re.search(r'exec: "([^"]+)"', text)
            program = missing.group(1) if missing else self._program
            what = f" ({program} is not in the image)" if program else ""
            return f"image {image} has no ipykernel: install it or choose another image{what}"
        if "/etc/mtab symlink" in text:
            return (
                f"image {image} cannot run with --userns=keep-id from the squashed store on this host: "
                "set keep_id to false in the kernelspec"
            )
        detail = error_message(text) if text.strip() else f"exit code {code}"
        return f"the kernel container of image {image} exited before the kernel started: {detail}"

    # --- running ------------------------------------------------------------------

    async def poll(self) -> int | None:
        """None while the kernel runs, else its exit code; a killed ``podman run`` counts as running while
        its container still is."""
        if self.process is None:
            return 0
        code = self.process.poll()
        if code is None or code >= 0:
            return code
        # podman run itself was killed: the container may live on without it.
        now = time.monotonic()
        if now - self._lost_check > 1.0:
            self._lost_check = now
            self._lost_running = await asyncio.to_thread(self._container_running)
        return None if self._lost_running else code

    def _container_running(self) -> bool:
        assert self._podman is not None
        result = self._podman(
            "container", "inspect", "--format", "{{.State.Running}}", self.container_name, check=False
        )
        return result.returncode == 0 and result.stdout.strip() == "true"

    async def wait(self) -> int | None:
        """Wait until the kernel has exited and its output is drained; its exit code (0 if it was never
        started)."""
        if self.process is None:
            return 0
        while (code := await self.poll()) is None:
            await asyncio.sleep(0.1)
        self.process.wait()
        if self._drain is not None:
            await asyncio.to_thread(self._drain.join, 2)
        self.process = None
        return code

    async def _remove_container(self) -> None:
        if self._podman is not None and self.container_name:
            await asyncio.to_thread(self._podman.remove_containers, self.container_name)

    async def _podman_quiet(self, *args: str) -> None:
        if self._podman is None:
            return
        result = await asyncio.to_thread(self._podman, *args, check=False)
        if result.returncode != 0:
            self.log.debug("podman-hpc: podman %s: %s", " ".join(args[:2]), error_message(result.stderr or ""))

    async def send_signal(self, signum: int) -> None:
        """Signal the kernel: through podman to the container's init, which forwards it."""
        if self.process is None or not self.container_name:
            return
        if signum == 0:
            return
        if signum == signal.SIGKILL:
            await self.kill()
            return
        await self._podman_quiet("kill", "--signal", str(int(signum)), self.container_name)

    async def terminate(self, restart: bool = False) -> None:
        """Ask the kernel to stop: SIGTERM to the container (``restart`` makes no difference)."""
        await self.send_signal(signal.SIGTERM)

    async def kill(self, restart: bool = False) -> None:
        """Kill the kernel's container (SIGKILL through podman); ``restart`` makes no difference."""
        if self.container_name:
            await self._podman_quiet("kill", "--signal", "KILL", self.container_name)

    async def _discard(self) -> None:
        """Forget a kernel that never started: no container, no process, no watchdog."""
        await self._remove_container()
        if self.process is not None:
            try:
                await asyncio.to_thread(self.process.wait, 10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        self._reap_watchdog()

    def _reap_watchdog(self) -> None:
        if self._watchdog is not None and self._watchdog.poll() is not None:
            self._watchdog = None

    async def cleanup(self, restart: bool = False) -> None:
        """After the kernel ended: jupyter_client's clean-up, then, unless it restarts, its container
        removed; its watchdog reaped."""
        await super().cleanup(restart=restart)
        if not restart and self.container_name:
            # podman run --rm removed it when it ended normally; make sure in every case.
            await self._remove_container()
        self._reap_watchdog()

    def get_shutdown_wait_time(self, recommended: float = 5.0) -> float:
        """Seconds to wait for a clean shutdown: at least 10, since the container is stopped and removed
        too."""
        # a container also has to be stopped and removed
        return max(recommended, 10.0)

    def get_stable_start_time(self, recommended: float = 10.0) -> float:
        """Seconds a kernel must run before its restart counts as stable: at least 20, a container starts
        slower than a process."""
        return max(recommended, 20.0)

    async def get_provisioner_info(self) -> dict[str, Any]:
        """What jupyter_client persists of this provisioner, with the container's name and image
        (``load_provisioner_info`` reads it back)."""
        info = await super().get_provisioner_info()
        info.update({"container_name": self.container_name, "image": self.image})
        return info

    async def load_provisioner_info(self, provisioner_info: dict) -> None:
        """Restore what ``get_provisioner_info`` saved: the container's name and image."""
        await super().load_provisioner_info(provisioner_info)
        self.container_name = provisioner_info.get("container_name", "")
        self.image = provisioner_info.get("image", self.image)
