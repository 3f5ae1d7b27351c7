"""The docs build's check of the repository's own Markdown links (docs/_ext/repolinks.py): README,
CONTRIBUTING and CHANGELOG are read on GitHub, not built, so this check is what keeps their links
from breaking when a page moves."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import repolinks  # noqa: E402


def test_a_link_to_a_moved_page_is_reported_and_the_others_are_not(tmp_path):
    (tmp_path / "docs" / "operators").mkdir(parents=True)
    (tmp_path / "docs" / "operators" / "site.md").write_text("# Site\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Project\n\n"
        "[the site guide](docs/operators/site.md), [its hub](docs/operators/site.md#the-hub),\n"
        "[the old path](docs/site.md), [a heading](#project), [the web](https://jupyter.org),\n"
        "[outside](../elsewhere.md)\n\n"
        "```\n[in a code block](nowhere.md)\n```\n"
    )
    assert repolinks.missing(readme, tmp_path.resolve()) == [(3, "docs/site.md"), (3, "../elsewhere.md")]


def test_the_repository_markdown_links_resolve():
    broken = {name: repolinks.missing(ROOT / name, ROOT) for name in repolinks.FILES}
    assert broken == {name: [] for name in repolinks.FILES}
