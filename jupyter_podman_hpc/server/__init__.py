"""The jupyter_server extension of jupyter-podman-hpc: a REST API and event stream.

Enabled on install (etc/jupyter/jupyter_server_config.d/jupyter_podman_hpc.json);
configured with ``c.PodmanHPC.<setting>`` (see ``backend.PodmanHPC``).

- ``backend``: what each endpoint does, as plain methods over the engine and the job API
- ``handlers``: the REST handlers (thin: check input, call the backend, write JSON)
- ``tasks``: background pulls, builds and squashes, with progress events
- ``validation``: checks on request bodies and paths
"""


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_podman_hpc.server"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .backend import Backend, PodmanHPC
    from .handlers import handlers

    _log_through(serverapp.log)
    settings = PodmanHPC(parent=serverapp)
    backend = Backend(settings, serverapp.root_dir, log=serverapp.log)
    serverapp.web_app.settings["podman_hpc_backend"] = backend
    serverapp.web_app.add_handlers(".*$", handlers(serverapp.web_app.settings["base_url"]))
    _sweep_orphan_kernels(serverapp.log)
    _sweep_orphan_services(backend, serverapp.log)
    _stop_on_shutdown(serverapp, backend)
    _kernel_start_errors_as_messages(serverapp.kernel_manager)
    backend.start_kernel_pools(serverapp.kernel_spec_manager)
    serverapp.log.info(
        "jupyter_podman_hpc server extension loaded (podman-hpc API at %spodman-hpc/api/)",
        serverapp.web_app.settings["base_url"],
    )


def _log_through(server_log) -> None:
    """The engine's log (each command it runs, at debug level) goes to the server's log,
    at the server's level: ``jupyter lab --log-level=DEBUG`` shows it."""
    import logging

    from ..engine.base.commands import LOGGER

    logging.getLogger(LOGGER).parent = server_log


def _kernel_start_errors_as_messages(kernel_manager) -> None:
    """A container kernel that cannot start says why (not "Unhandled error") to the user."""
    from jupyter_core.utils import ensure_async

    from ..engine.errors import EngineError
    from .handlers import KernelStartFailed

    start = kernel_manager.start_kernel

    async def start_kernel(*args, **kwargs):
        try:
            return await ensure_async(start(*args, **kwargs))
        except EngineError as err:
            raise KernelStartFailed(err) from err

    kernel_manager.start_kernel = start_kernel


def _sweep_orphan_services(backend, log) -> None:
    """The Podman services of a pull or build whose server died (SIGKILL) are stopped, and their
    build containers removed, at the next start (see engine/service/sweep.py)."""
    import threading

    from ..engine.service.sweep import sweep

    def run():
        try:
            for line in sweep(backend.site(), backend.environ()):
                log.info("podman-hpc: %s", line)
        except Exception as err:  # noqa: BLE001 - a failed sweep must not stop the server
            log.warning("podman-hpc: could not look for orphaned Podman services: %s", err)

    threading.Thread(target=run, name="podman-hpc-service-sweep", daemon=True).start()


def _stop_on_shutdown(serverapp, backend) -> None:
    """A server stopped by SIGTERM (or from the UI) first stops restarting its kernels: at a job's
    SIGTERM each kernel's watchdog removes its container, and a restart by a server on its way out
    would start one that nothing removes. Then it cancels its pulls and builds and records them as
    interrupted, rather than leaving their Podman services running; once its kernels are shut down,
    it closes its kernel pools (their waiting containers go)."""
    import asyncio

    cleanup_extensions, cleanup_kernels = serverapp.cleanup_extensions, serverapp.cleanup_kernels

    async def stop_tasks_then_extensions():
        for kernel_id in serverapp.kernel_manager.list_kernel_ids():
            serverapp.kernel_manager.get_kernel(kernel_id).stop_restarter()
        try:
            await asyncio.get_running_loop().run_in_executor(None, backend.tasks.shutdown)
        except Exception:
            serverapp.log.exception("podman-hpc: stopping the pulls and builds failed")
        await cleanup_extensions()

    async def stop_kernels_then_pools():
        await cleanup_kernels()
        await asyncio.get_running_loop().run_in_executor(None, backend.close_kernel_pools)

    serverapp.cleanup_extensions = stop_tasks_then_extensions
    serverapp.cleanup_kernels = stop_kernels_then_pools


def _sweep_orphan_kernels(log) -> None:
    """Container kernels of a server that died (killed, crashed) are removed at the next start."""
    import threading

    from ..kernels.orphans import sweep_environment

    def sweep():
        try:
            sweep_environment()
        except Exception as err:  # noqa: BLE001 - a failed sweep must not stop the server
            log.warning("podman-hpc: could not look for orphaned kernel containers: %s", err)

    threading.Thread(target=sweep, name="podman-hpc-orphans", daemon=True).start()
