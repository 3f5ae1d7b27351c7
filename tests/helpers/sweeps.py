"""What a sweep of killed monitors or tasks removes (engine/run/stepmonitor.py,
engine/run/perprocess.py), recorded by a stand-in for Podman."""


class RemovalsPodman:
    """Stands in for Podman in a sweep: records the containers removed and the conmons killed."""

    def __init__(self) -> None:
        self.removed: list[str] = []
        self.killed: list[str] = []

    def remove_containers(self, *names: str) -> None:
        self.removed += names
