"""The engine's errors: each carries a one-line message for the user and an exit code."""


class EngineError(Exception):
    """A failure the user can act on; ``str()`` is the whole message."""

    exit_code = 125  # podman's code for errors of the tool itself

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class ConfigError(EngineError):
    """The site configuration or the environment is invalid."""


class ModuleError(EngineError):
    """Modules were asked for that do not exist, conflict or lack a dependency."""


class ImageNotFound(EngineError):
    """No local or squashed image matches the reference."""


class InvalidReference(EngineError):
    """A string is not a valid image reference."""


class PodmanError(EngineError):
    """podman exited with an error; ``exit_code`` is podman's."""

    def __init__(self, message: str, exit_code: int = 125, output: str = ""):
        super().__init__(message, exit_code)
        self.output = output
