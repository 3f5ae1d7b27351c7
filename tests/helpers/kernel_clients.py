"""A kernel started and driven as a front does, with jupyter_client (the provisioner's tests and
those run inside a kernel)."""

import time

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager


def start(name: str, **kwargs):
    """A started KernelManager and a ready client, and the seconds it took."""
    started = time.monotonic()
    km = KernelManager(kernel_name=name, kernel_spec_manager=KernelSpecManager())
    km.start_kernel(**kwargs)
    kc = km.client()
    kc.start_channels()
    kc.wait_for_ready(timeout=60)
    return km, kc, time.monotonic() - started


def run(kc, code: str, timeout: float = 30) -> tuple[dict, str]:
    """Execute ``code``; the reply's content and the stdout text."""
    out: list[str] = []

    def hook(msg):
        if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
            out.append(msg["content"]["text"])

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(out)
