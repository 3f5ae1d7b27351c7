"""Engine errors become HTTP answers by their kind, in one table."""

import pytest

from jupyter_podman_hpc.engine.errors import (
    ConfigError,
    Conflict,
    EngineError,
    ImageNotFound,
    PermissionDenied,
    PodmanError,
)
from jupyter_podman_hpc.engine.service.rest import ServiceError
from jupyter_podman_hpc.kernels.kernelspec import KernelNotFound
from jupyter_podman_hpc.kernels.provisioner import KernelStartError
from jupyter_podman_hpc.server.handlers import KernelStartFailed, http_error, http_status
from jupyter_podman_hpc.slurm.client import SlurmError
from jupyter_podman_hpc.slurm.jobs import JobNotFound
from jupyter_podman_hpc.slurm.spec import JobSpecError


@pytest.mark.parametrize(
    "error, status",
    [
        (ImageNotFound("x"), 404),
        (JobNotFound("x"), 404),
        (KernelNotFound("x"), 404),
        (PermissionDenied("x"), 403),
        (Conflict("x"), 409),
        (JobSpecError("x"), 400),
        (ConfigError("x"), 400),
        (EngineError("x"), 400),
        (PodmanError("x"), 502),
        (ServiceError("x"), 502),
        (SlurmError("sbatch: Invalid partition name"), 400),
    ],
)
def test_each_kind_of_error_has_its_status(error, status):
    assert http_status(error) == status


def test_the_answer_carries_the_first_line_of_the_message():
    error = http_error(ImageNotFound("image 100% gone\npodman said more"))
    assert (error.status_code, error.reason) == (404, "image 100% gone")
    assert http_error(EngineError("x"), default=500).status_code == 500


def test_a_kernel_start_error_reaches_jupyter_server_users_whole():
    error = KernelStartFailed(KernelStartError("image x:1 has no ipykernel (100% sure)"))
    assert error.status_code == 500 and error.reason == "Kernel failed to start"
    # jupyter_server's kernel handler shows log_message, its session handler str()
    assert error.log_message.replace("%%", "%") == str(error) == "image x:1 has no ipykernel (100% sure)"
    assert KernelStartFailed(ImageNotFound("image x:1 not found")).status_code == 404
