"""Tables the magics return: lists that are data in Python and display as tables.

``ImageList`` (``%podman_hpc images``) and ``KernelList`` (``kernel list``)
are ``list`` subclasses of the engine's own records (``ImageInfo``,
``ContainerKernel``): index, filter and loop over them, or turn them into
dicts with ``records()`` (e.g. for ``pandas.DataFrame``). IPython shows them
as an HTML table in a notebook and as aligned text in a terminal.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from ..engine.text import image_rows, text_table


def html_table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (a header, then the rows) as an HTML table, each cell escaped and left-aligned."""
    head = "".join(f"<th style='text-align:left'>{html.escape(str(cell))}</th>" for cell in rows[0])
    body = "".join(
        "<tr>" + "".join(f"<td style='text-align:left'>{html.escape(str(cell))}</td>" for cell in row) + "</tr>"
        for row in rows[1:]
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


class _Table(list):
    EMPTY = "none"

    def rows(self) -> list[tuple[str, ...]]:
        """The table to show: a header row, then one row per item or more (each subclass says)."""
        raise NotImplementedError

    def records(self) -> list[dict]:
        """Each item as a dict."""
        return [item.as_dict() for item in self]

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(text_table(self.rows()) if self else self.EMPTY)

    def _repr_html_(self) -> str:
        return html_table(self.rows()) if self else f"<p>{html.escape(self.EMPTY)}</p>"


class ImageList(_Table):
    """``ImageInfo`` records (``names``, ``id``, ``short_id``, ``size``, ``created``, ``local``,
    ``squashed``, ``stores``); one table row per name, as ``podman-hpc images`` prints them."""

    EMPTY = "no images"

    def rows(self) -> list[tuple[str, ...]]:
        """The table ``podman-hpc images`` prints: a header, then a row per name of each image."""
        return image_rows(self)

    def named(self, name: str):
        """The image with this name (any form podman resolves it to), or None."""
        from ..engine.reference import candidate_names

        wanted = set(candidate_names(name))
        return next((image for image in self if wanted & set(image.names)), None)


class KernelList(_Table):
    """``ContainerKernel`` records (``name``, ``display_name``, ``image``, ``modules``, ``path``)."""

    EMPTY = "no podman-hpc kernels"

    def rows(self) -> list[tuple[str, ...]]:
        """The kernels table: a header, then name, display name, image, modules and path of each kernel."""
        rows = [("NAME", "DISPLAY NAME", "IMAGE", "MODULES", "PATH")]
        rows += [(k.name, k.display_name, k.image, ",".join(k.modules) or "-", k.path) for k in self]
        return rows


__all__ = ["ImageList", "KernelList", "html_table"]
