"""What the engine's integration tests share."""


def recording_podman(hpc, name):
    """A podman that writes down its arguments before it runs: (its path, the list's path)."""
    calls = hpc.work / f"{name}-calls"
    calls.touch()
    wrapper = hpc.work / f"{name}-podman"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec podman "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), calls
