"""Project stores: a squashed store whose directory has the setgid bit is its group's, and the
modes its new files and directories get (``Sharing``).

Everything written into a project store gets the group's read permission (and write permission
when the directory is group-writable, so every member migrates into it under the same locks),
and nothing for others. In a group-writable store, directories are sticky (3770: a member
cannot rename, replace or remove another's files; the two record directories excepted) and
squash files are 0640 (written once, by their maker). A personal store keeps the user's umask.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Sharing:
    """The modes a store's new files and directories get."""

    group: bool = False  # a project store: its group reads it
    group_write: bool = False  # ... and writes it

    @classmethod
    def of(cls, root: Path) -> Sharing:
        """Read from the store's directory (or, before it exists, from its parent's setgid bit)."""
        for directory in (root, root.parent):
            try:
                mode = directory.stat().st_mode
            except OSError:
                continue
            if not mode & stat.S_ISGID:
                return cls()
            return cls(group=True, group_write=bool(mode & stat.S_IWGRP))
        return cls()

    def file_mode(self) -> int | None:
        """None for a personal store: the user's umask decides, as before."""
        return (0o660 if self.group_write else 0o640) if self.group else None

    def squash_mode(self) -> int | None:
        """Squash files are written once, by the member who squashes: the group only reads them."""
        return 0o640 if self.group else None

    def dir_mode(self, records: bool = False) -> int | None:
        """Sticky (3770) in a group-writable store, so that members cannot rename, replace or
        remove each other's files; the record directories stay 2770, since every member
        replaces ``images.json`` and ``layers.json`` (rename over them) when it writes."""
        if not self.group:
            return None
        if not self.group_write:
            return 0o2750
        return 0o2770 if records else 0o3770
