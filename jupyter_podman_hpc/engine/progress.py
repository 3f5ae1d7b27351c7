"""Progress events of long engine operations (pull, build, squash, job wait).

Engine functions take an optional ``progress`` callback; the CLI renders the
events as a terminal bar, the magics as widgets, the server as an event stream.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Progress:
    stage: str  # "pull", "squash", "build", "job", ...
    message: str = ""  # a human-readable line: a build step, a layer, a state
    current: int | None = None
    total: int | None = None
    item: str = ""  # what ``current``/``total`` count for: a layer digest, a step
    log: str = ""  # a raw output line, when there is one

    @property
    def fraction(self) -> float | None:
        """How far along, 0.0 to 1.0, when current and total are known; None otherwise."""
        if self.current is None or not self.total:
            return None
        return min(1.0, self.current / self.total)

    def as_dict(self) -> dict:
        """The event's fields as a dict, as a front sends it (JSON)."""
        return asdict(self)


ProgressCallback = Callable[[Progress], None]


def ignore(_: Progress) -> None:
    """The default callback."""
