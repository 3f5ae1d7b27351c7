"""Sphinx configuration of the docs site: MyST Markdown pages by audience, built with `make docs`."""

import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

from jupyter_podman_hpc.version import __version__  # noqa: E402 - after the path set-up, like every conf.py

project = "jupyter-podman-hpc"
copyright = "the jupyter-podman-hpc authors"
version = release = __version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinxarg.ext",
    "helptext",
    "repolinks",
]

# `page.md#a-heading` links, as GitHub renders them
myst_heading_anchors = 3
exclude_patterns = ["build"]
# Command lines keep their "--" and quotes as typed
smartquotes = False

# The API pages show what the docstrings say, with the type hints in the signatures.
autodoc_typehints = "signature"
autodoc_member_order = "bysource"
# Type hints name the standard library's types and the package's internal classes, which these
# pages do not document: not links a writer made, so -n does not hold them to resolve.
nitpick_ignore_regex = [
    ("py:(class|obj)", r"(pathlib|typing|collections\.abc)\..*"),
    ("py:(class|obj)", r"(tuple|dict|list|typing\.Mapping)\[.*"),
    ("py:class", r"jupyter_podman_hpc\..*"),
]

html_theme = "pydata_sphinx_theme"
html_title = project
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
}
