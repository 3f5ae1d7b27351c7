"""Hatch build hook: build the JupyterLab extension before a wheel is made.

Wired in pyproject.toml as `[tool.hatch.build.targets.wheel.hooks.custom]`,
so it runs for `pip install .` (standard wheel) and `pip install --editable .`
(editable wheel), not for the sdist, which ships the TypeScript sources.
The work is done by labextension/build.py (see its docstring); the wheel's
`shared-data` then installs jupyter_podman_hpc/labextension as
share/jupyter/labextensions/jupyter-podman-hpc.

The build needs jupyterlab in the build environment (its `staging` directory
is the core the extension is built against). The hook asks for it, through
`dependencies()`, only when the extension needs building: a reinstall of an
unchanged checkout does not install jupyterlab into pip's isolated build
environment.
"""

import importlib.util
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


def _load_build_script(root: str):
    path = Path(root) / "labextension" / "build.py"
    spec = importlib.util.spec_from_file_location("_jph_labextension_build", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LabExtensionBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def dependencies(self) -> list[str]:
        if self.target_name != "wheel":
            return []
        if _load_build_script(self.root).is_fresh():
            return []
        return [self.config.get("core-requirement", "jupyterlab>=4.2,<5")]

    def initialize(self, version: str, build_data: dict) -> None:
        if self.target_name != "wheel":
            return
        script = _load_build_script(self.root)
        try:
            script.build(log=self.app.display_info)
        except script.BuildError as error:
            self.app.abort(f"cannot build the JupyterLab extension: {error}")
