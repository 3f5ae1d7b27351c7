"""A Sphinx directive that shows a command's usage text, read from the module that prints it.

``{helptext} jupyter_podman_hpc.cli.USAGE`` renders that string as a literal block, so the
reference says what ``podman-hpc --help`` says, and cannot drift from it.
"""

import importlib

from docutils import nodes
from sphinx.util.docutils import SphinxDirective


class HelpText(SphinxDirective):
    """A module-level string (``package.module.NAME``), shown as a literal block."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name, _, attribute = self.arguments[0].rpartition(".")
        try:
            text = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise self.error(f"helptext: cannot read {self.arguments[0]}: {error}") from error
        if not isinstance(text, str):
            raise self.error(f"helptext: {self.arguments[0]} is not a string")
        return [nodes.literal_block(text, text.rstrip("\n"), language="text")]


def setup(app) -> dict:
    """Register the ``helptext`` directive."""
    app.add_directive("helptext", HelpText)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
