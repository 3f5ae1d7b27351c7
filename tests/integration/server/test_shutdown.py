"""What a stopping server does before its kernels are shut down."""

import asyncio

import psutil


async def test_a_stopping_server_restarts_no_kernel_that_dies_meanwhile(jp_serverapp, server_hpc):
    """At a job's SIGTERM a container kernel's watchdog removes its container while the server
    cancels its pulls and builds; jupyter_client's restarter, still polling then, would start a new
    container that nothing removes (a fresh-clone run once left one so). The extension's clean-up,
    which runs before the kernels' shutdown, stops the restarters first."""
    manager = jp_serverapp.kernel_manager
    kernel_id = await manager.start_kernel(kernel_name="python3")
    kernel = manager.get_kernel(kernel_id)
    try:
        first = kernel.provisioner.pid
        await jp_serverapp.cleanup_extensions()
        psutil.Process(first).kill()
        await asyncio.sleep(2 * kernel.restarter_class.time_to_dead.default_value + 1)  # two polls
        assert kernel.provisioner.pid == first  # no new kernel started
    finally:
        await jp_serverapp.cleanup_kernels()
