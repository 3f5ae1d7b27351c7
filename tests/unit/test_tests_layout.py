"""The suite's own layout: test modules share plain helpers through the modules of tests/helpers
(its index docstring names each) and fixtures through pytest's discovery of ``conftest.py`` files.
Never by importing another test module, whose tests pytest would then see twice and whose
helpers nobody looks for there; never by importing from a conftest, which holds fixtures (a
fixture that tests of several folders use is in the conftest of their common parent)."""

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_modules(path: Path) -> list[str]:
    """Every module the module at ``path`` imports from (relative ones with their leading dots)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (``test_*``) that the module at ``path`` imports from."""
    return [name for name in imported_modules(path) if name.rpartition(".")[2].startswith("test_")]


def imported_conftests(path: Path) -> list[str]:
    """The conftest modules that the module at ``path`` imports from."""
    return [name for name in imported_modules(path) if name.rpartition(".")[2] == "conftest"]


def test_no_test_module_imports_another():
    offenders = {
        str(path.relative_to(TESTS)): imported
        for path in sorted(TESTS.rglob("*.py"))
        if (imported := imported_test_modules(path))
    }
    assert offenders == {}


def test_the_check_sees_an_import_of_a_test_module(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text(
        "from tests.integration.engine.test_launcher_stress import wait_running\n"
        "from .test_pool import install\nimport tests.unit.test_y\nfrom .conftest import run\n"
    )
    assert imported_test_modules(module) == [
        "tests.integration.engine.test_launcher_stress",
        ".test_pool",
        "tests.unit.test_y",
    ]


def test_no_module_imports_from_a_conftest():
    offenders = {
        str(path.relative_to(TESTS)): imported
        for path in sorted(TESTS.rglob("*.py"))
        if (imported := imported_conftests(path))
    }
    assert offenders == {}


def test_the_check_sees_an_import_from_a_conftest(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text(
        "from tests.conftest import run\nfrom .conftest import start\nimport tests.unit.conftest\n"
        "from tests.helpers.commands import run\nfrom . import conftest_like\n"
    )
    assert imported_conftests(module) == ["tests.conftest", ".conftest", "tests.unit.conftest"]


def test_the_helpers_index_names_each_helper_module():
    helpers = TESTS / "helpers"
    docstring = ast.get_docstring(ast.parse((helpers / "__init__.py").read_text())) or ""
    listed = set(re.findall(r"^- ``(\w+)``", docstring, re.MULTILINE))
    modules = {path.stem for path in helpers.glob("*.py") if path.stem != "__init__"}
    assert sorted(modules - listed) == [], "helper modules the index does not name"
    assert sorted(listed - modules) == [], "the index names helper modules that are gone"
