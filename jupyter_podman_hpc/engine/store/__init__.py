"""The squashed image store: its on-disk format, its files, who may use which store.

- ``squashed``: the squashed image store's on-disk format (records, squash files, locks)
- ``graphroot``: a podman graph root's records read as podman reads them; ``GraphRoot.find`` matches a reference or id
- ``access``: which squashed stores apply to the user (own, project, site) and what the user may do with each;
  writes and removals refused before they start
- ``sharing``: project stores (setgid: their group's), and the modes a store's new files and directories get
- ``records``: the store's records checked as they are read (ids, links)
- ``fs``: files of a shared store reached through directory descriptors, no link followed
- ``squashcheck``: each squash file's sha256, checked once per file identity on a node
- ``remove``: removing an image (or one of its names) from a squashed store: records first, then files
"""
