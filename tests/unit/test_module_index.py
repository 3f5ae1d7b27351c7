"""Each part of the package lists its modules in its docstring (``- ``name``: its job``), so a
newcomer finds a module's job without opening it: every module is listed, none that is gone."""

import ast
import re
from pathlib import Path

import pytest

import jupyter_podman_hpc

PACKAGE = Path(jupyter_podman_hpc.__file__).parent


PARTS = [
    "engine",
    "slurm",
    "kernels",
    *(f"engine/{room.name}" for room in sorted((PACKAGE / "engine").iterdir()) if (room / "__init__.py").exists()),
]


@pytest.mark.parametrize("part", PARTS)
def test_the_docstring_of_each_part_names_its_modules(part):
    directory = PACKAGE / part
    docstring = ast.get_docstring(ast.parse((directory / "__init__.py").read_text())) or ""
    named = set(re.findall(r"``(\w+)``", docstring))
    modules = {path.stem for path in directory.glob("*.py") if path.stem != "__init__"}
    modules |= {path.parent.name for path in directory.glob("*/__init__.py")}  # its subpackages
    assert sorted(modules - named) == [], f"modules of {part}/ its docstring does not name"
    listed = set(re.findall(r"^- ``(\w+)``", docstring, re.MULTILINE))
    assert sorted(listed - modules) == [], f"{part}/'s docstring lists modules that are gone"
