"""What the records of a squashed store may say: ids, links and a squash file's digest.

A project store's records (``images.json``, ``layers.json``, a layer's
``link`` file) are written by every member of its group, so they are data
to check, never paths to trust: a layer id such as ``../../..`` or
``/home/alice`` would otherwise become a directory that the next ``rmsqi``
removes. Ids are what containers/storage writes, 64 lowercase hex digits;
a link is what its overlay driver generates (``generateID(26)``: the first
26 characters of random bytes in base32, ``A-Z2-7``). A record that fails
is skipped (``store`` warns once), never acted on.

Kept free of ``re`` and ``dataclasses``: the mount program imports this for
every container start.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag, which type checkers read as true, without importing typing
if TYPE_CHECKING:
    from typing import TypeGuard

_HEX = frozenset("0123456789abcdef")
_BASE32 = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
LINK_LENGTH = 26

# The sha256 of an image's squash file, in its image record's ``flags``: containers/storage
# keeps an image's flags (a map for its users' own marks) and podman acts on none of ours;
# podman-hpc 1.2.2 updates a record it re-migrates key by key and keeps keys it does not know.
SQUASH_DIGEST = "podman-hpc.squash-digest"


def is_id(value: object) -> TypeGuard[str]:
    """An image or layer id as containers/storage writes it."""
    return isinstance(value, str) and len(value) == 64 and _HEX.issuperset(value)


def is_link(value: object) -> TypeGuard[str]:
    """A layer's short link name as containers/storage's overlay driver generates it."""
    return isinstance(value, str) and len(value) == LINK_LENGTH and _BASE32.issuperset(value)


def is_digest(value: object) -> TypeGuard[str]:
    """A ``sha256:`` digest with 64 hex digits, as image records hold them."""
    return isinstance(value, str) and value.startswith("sha256:") and is_id(value[7:])


def image_ok(record: object) -> bool:
    """An image record whose id, top layer and names are safe to act on."""
    if not isinstance(record, dict) or not is_id(record.get("id")):
        return False
    names = record.get("names") or []
    layer = record.get("layer") or ""
    return (layer == "" or is_id(layer)) and isinstance(names, list) and all(isinstance(n, str) for n in names)


def layer_ok(record: object) -> bool:
    """A layer record whose id and parent are safe to act on."""
    if not isinstance(record, dict) or not is_id(record.get("id")):
        return False
    parent = record.get("parent") or ""
    return parent == "" or is_id(parent)


def split(records: object, ok) -> tuple[list[dict], list]:
    """(the records that pass ``ok``, the others) of a JSON file's list."""
    if not isinstance(records, list):
        return [], [records]
    good = [record for record in records if ok(record)]
    return good, [record for record in records if not ok(record)]


def squash_digest(record: dict) -> str:
    """The recorded sha256 (hex) of the image's squash file, or '' (podman-hpc 1.2.2's
    records, and ours from before the check, have none)."""
    flags = record.get("flags")
    value = flags.get(SQUASH_DIGEST) if isinstance(flags, dict) else None
    return value[7:] if is_digest(value) else ""


def set_squash_digest(record: dict, digest: str) -> None:
    """Note in an image record (its flags) the sha256 digest of its squash file, as ``sha256:<hex>``; other
    flags are kept."""
    flags = record.get("flags")
    record["flags"] = {**(flags if isinstance(flags, dict) else {}), SQUASH_DIGEST: f"sha256:{digest}"}


def layer_of_link_target(target: str) -> str:
    """The layer id of a short link's target (``../<layer>/diff``), or ''."""
    parts = target.split("/")
    if len(parts) == 3 and parts[0] == ".." and parts[2] == "diff" and is_id(parts[1]):
        return parts[1]
    return ""
