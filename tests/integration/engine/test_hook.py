"""The OCI hook: a module's `copy` entries land in the container and ldconfig sees them."""

import subprocess

from tests.helpers.commands import run
from tests.helpers.site_modules import library_module


def test_module_copy_entries_and_ldconfig(squashed_base, stack, tmp_path):
    hpc = squashed_base
    modules = library_module(tmp_path, "jphtest", ["/opt/jphtest/lib/"], "/opt/jphtest/lib")
    env = {**hpc.env, "PODMANHPC_MODULES_DIR": str(modules)}
    with_module = run(
        [
            "podman-hpc",
            "run",
            "--rm",
            "--jphtest",
            stack.base_image,
            "sh",
            "-c",
            "ls /opt/jphtest/lib; cat /etc/ld.so.conf.d/jphtest.conf; ldconfig -p | grep jphtest",
        ],
        env=env,
    )
    lines = with_module.stdout.splitlines()
    assert lines[0] == "libjphtest.so.1"
    assert lines[1] == "/opt/jphtest/lib"
    assert "libjphtest.so.1" in lines[2] and "/opt/jphtest/lib/libjphtest.so.1" in lines[2]
    without = subprocess.run(
        ["podman-hpc", "run", "--rm", stack.base_image, "ls", "/opt/jphtest"], env=env, capture_output=True, text=True
    )
    assert without.returncode != 0  # only containers with the module get the files
