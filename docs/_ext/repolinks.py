"""Check the links of the repository's own Markdown files (README, CONTRIBUTING, CHANGELOG) in the docs build.

They are read on GitHub, not built into the site, so Sphinx never sees their links; this extension
warns (an error under ``-W``) for each relative link whose target file is not in the repository.
"""

from pathlib import Path
from urllib.parse import unquote, urlsplit

from markdown_it import MarkdownIt
from sphinx.util import logging

FILES = ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")

logger = logging.getLogger(__name__)


def links(text: str) -> list[tuple[int, str]]:
    """(first line of its paragraph, target) of every link and image in Markdown ``text``."""
    found = []
    for block in MarkdownIt("commonmark").parse(text):
        line = block.map[0] + 1 if block.map else 0
        for token in block.children or []:
            target = token.attrGet("href") or token.attrGet("src")
            if token.type in ("link_open", "image") and target:
                found.append((line, str(target)))
    return found


def missing(path: Path, root: Path) -> list[tuple[int, str]]:
    """The relative links of ``path`` whose file or directory is not under ``root``."""
    broken = []
    for line, target in links(path.read_text()):
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or not parts.path:
            continue  # a web address, or a heading of the same file
        resolved = (path.parent / unquote(parts.path)).resolve()
        if not resolved.is_relative_to(root) or not resolved.exists():
            broken.append((line, target))
    return broken


def check(app) -> None:
    """Warn for each broken relative link of the repository's Markdown files."""
    root = Path(app.srcdir).resolve().parent
    for name in FILES:
        path = root / name
        if not path.exists():
            logger.warning("repolinks: %s is missing", name)
            continue
        for line, target in missing(path, root):
            logger.warning("link to %s: no such file in the repository", target, location=f"{path}:{line}")


def setup(app) -> dict:
    """Run the check once the builder starts."""
    app.connect("builder-inited", check)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
