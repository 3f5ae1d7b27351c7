"""The engine's errors: each carries a one-line message for the user and an exit code.

Fronts act on the kind of an error, never on its message: the CLI exits with
``exit_code``, the magics print the message, the REST API answers the HTTP
status of the kind (one table, ``server/handlers.py``). Raise the most precise
kind; a module's own errors derive from one of these.
"""


class EngineError(Exception):
    """A failure the user can act on; ``str()`` is the whole message."""

    exit_code = 125  # podman's code for errors of the tool itself

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class InvalidInput(EngineError):
    """What the user gave is malformed or not allowed (an option, a field, a name)."""


class NotFound(EngineError):
    """Something the user named does not exist (an image, a job, a kernel)."""


class Conflict(EngineError):
    """What was asked clashes with what exists or runs (a name taken, a lock held)."""


class PermissionDenied(EngineError):
    """The user may not read or write what was asked (a shared store, a directory)."""


class ToolFailed(EngineError):
    """A program the engine relies on (podman, the Podman service) failed for a reason of
    its own, not the request's; the message is the program's."""


class StorageFull(EngineError):
    """A file system the engine writes to (a squashed store) is full or over quota (ENOSPC,
    EDQUOT); the message names it. Nothing half-written is left visible there."""


class ConfigError(InvalidInput):
    """The site configuration or the environment is invalid."""


class ModuleError(InvalidInput):
    """Modules were asked for that do not exist, conflict or lack a dependency."""


class ImageNotFound(NotFound):
    """No local or squashed image matches the reference."""


class InvalidReference(InvalidInput):
    """A string is not a valid image reference."""


class PodmanError(ToolFailed):
    """podman exited with an error; ``exit_code`` is podman's."""

    def __init__(self, message: str, exit_code: int = 125, output: str = ""):
        super().__init__(message, exit_code)
        self.output = output
