"""The suite's own layout: test modules share helpers and fixtures through ``conftest.py``
modules (or plain helper modules), never by importing another test module, whose tests pytest
would then see twice and whose helpers nobody looks for there."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (``test_*``) that the module at ``path`` imports from."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] if node.level == 0 else ["." * node.level + node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if name.rpartition(".")[2].startswith("test_")]
    return found


def test_no_test_module_imports_another():
    offenders = {str(path.relative_to(TESTS)): imported for path in sorted(TESTS.rglob("*.py"))
                 if (imported := imported_test_modules(path))}
    assert offenders == {}


def test_the_check_sees_an_import_of_a_test_module(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("from tests.integration.engine.test_launcher_stress import wait_running\n"
                      "from .test_pool import install\nimport tests.unit.test_y\nfrom .conftest import run\n")
    assert imported_test_modules(module) == ["tests.integration.engine.test_launcher_stress", ".test_pool", "tests.unit.test_y"]
