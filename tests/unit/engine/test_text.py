"""Sizes and tables as every front prints them."""

from jupyter_podman_hpc.engine.images.catalog import ImageInfo
from jupyter_podman_hpc.engine.text import human_bytes, image_rows, text_table, truth


def test_human_bytes():
    assert [human_bytes(n) for n in (0, 999, 1000, 1_084_004, 136_749_269, 5 * 10**12, None)] == [
        "0 B",
        "999 B",
        "1.0 kB",
        "1.1 MB",
        "136.7 MB",
        "5.0 TB",
        "?",
    ]


def test_text_table_aligns_columns_and_drops_trailing_blanks():
    assert text_table([("A", "LONG HEADER", "C"), ("wide cell", "x", "")]).splitlines() == [
        "A          LONG HEADER  C",
        "wide cell  x",
    ]


def test_image_rows_one_row_per_name_and_shadowed_names_marked():
    image = ImageInfo(
        id="c" * 64,
        names=["localhost/a:1", "localhost/a:2"],
        size=1_500_000,
        created="2026-11-30T20:27:12+00:00",
        local=True,
        squashed=True,
        shadowed=["localhost/a:2"],
    )
    header, first, second = image_rows([image])
    assert header[0] == "REPOSITORY:TAG" and len(header) == 6
    assert first == ("localhost/a:1", "cccccccccccc", "2026-11-30 20:27:12", "1.5 MB", "yes", "local + squashed")
    assert second[-1] == "local + squashed (shadowed)"


def test_truth_reads_yes_and_no_words_and_nothing_else():
    assert [truth(w) for w in ("1", "TRUE", " yes ", "On", True)] == [True] * 5
    assert [truth(w) for w in ("0", "false", "No", "off", False, 0)] == [False] * 6
    assert [truth(w) for w in ("", "auto", "2", None)] == [None] * 4
