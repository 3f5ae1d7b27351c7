"""`%load_ext jupyter_podman_hpc` in a container kernel: one line saying what the image
needs when it lacks the package (no traceback); the magics load where the image has it
(here: the checkout's package mounted into the base image's dist-packages)."""

from __future__ import annotations

from pathlib import Path

import pytest

import jupyter_podman_hpc
from tests.helpers.kernel_clients import start

pytestmark = pytest.mark.slow

PACKAGE = Path(jupyter_podman_hpc.__file__).resolve().parent
SITE_PACKAGES = "/usr/local/lib/python3.11/dist-packages"


def outputs(kc, code: str) -> tuple[dict, str, str]:
    """Execute ``code``: the reply's content, stdout and stderr (what the notebook shows)."""
    streams = {"stdout": [], "stderr": []}
    errors: list[dict] = []

    def hook(msg):
        if msg["msg_type"] == "stream":
            streams[msg["content"]["name"]].append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            errors.append(msg["content"])

    reply = kc.execute_interactive(code, timeout=60, output_hook=hook)["content"]
    assert not errors, errors  # a traceback would be an error message
    return reply, "".join(streams["stdout"]), "".join(streams["stderr"])


def test_load_ext_without_the_package_is_one_line(kernel_site, stack):
    kernel_site.install(stack.base_image, "magics-absent")
    km, kc, _ = start("magics-absent")
    try:
        reply, _, err = outputs(kc, "%load_ext jupyter_podman_hpc")
        assert reply["status"] == "ok", reply
        assert len(err.strip().splitlines()) == 1, err
        assert "no module named 'jupyter_podman_hpc'" in err and "install jupyter-podman-hpc in the image" in err
        # other extensions keep IPython's own behaviour
        reply, _, _ = outputs(kc, "%load_ext autoreload")
        assert reply["status"] == "ok", reply
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_load_ext_where_the_image_has_the_package(kernel_site, stack):
    kernel_site.install(
        stack.base_image, "magics-present", podman_args=["--volume", f"{PACKAGE}:{SITE_PACKAGES}/jupyter_podman_hpc:ro"]
    )
    km, kc, _ = start("magics-present")
    try:
        reply, out, err = outputs(
            kc, "%load_ext jupyter_podman_hpc\nprint('podman_hpc' in get_ipython().magics_manager.magics['line'])"
        )
        assert reply["status"] == "ok", (reply, err)
        assert out.strip() == "True", (out, err)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
