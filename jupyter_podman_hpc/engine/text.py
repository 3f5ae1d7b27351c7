"""Text every front shows or reads the same way: sizes, aligned tables, the images table, yes/no words."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def human_bytes(size: int | float | None) -> str:
    """A size in decimal units as podman prints it (``136.7 MB``); ``?`` when unknown."""
    if size is None:
        return "?"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if value < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return str(size)


def text_table(rows: Sequence[Sequence[object]]) -> str:
    """Rows (the first a header) as left-aligned columns two spaces apart, without trailing blanks."""
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(rows[0]))]
    lines = ("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows)
    return "\n".join(line.rstrip() for line in lines)


TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def truth(word: object) -> bool | None:
    """A yes/no word (``1/true/yes/on``, ``0/false/no/off``, any case, spaces around) as a bool;
    a bool as itself; None for anything else, which the caller rejects or reads as its default."""
    if isinstance(word, bool):
        return word
    text = str(word).strip().lower()
    return True if text in TRUE_WORDS else False if text in FALSE_WORDS else None


def image_rows(images: Iterable) -> list[tuple[str, ...]]:
    """The images table of ``podman-hpc images`` (a header, then one row per name of each
    ``ImageInfo``), as the CLI prints it and the ``%podman_hpc images`` magic shows it."""
    rows: list[tuple[str, ...]] = [("REPOSITORY:TAG", "IMAGE ID", "CREATED", "SIZE", "SQUASHED", "STORE")]
    for image in images:
        for name in image.names or ["<none>"]:
            where = image.stores + (" (shadowed)" if name in image.shadowed else "")
            rows.append(
                (
                    name,
                    image.short_id,
                    image.created[:19].replace("T", " "),
                    human_bytes(image.size),
                    "yes" if image.squashed else "no",
                    where,
                )
            )
    return rows


__all__ = ["FALSE_WORDS", "TRUE_WORDS", "human_bytes", "image_rows", "text_table", "truth"]
