"""Images as a user sees them, and getting them: pull, build, squash.

- ``catalog``: local and squashed images as a user sees them; ``find_squashed`` finds one in the stores
- ``pull``: pulling an image (through the REST service for the fronts, ``podman pull`` for the CLI), then squashing it
- ``build``: building an image through the REST service, with structured progress and cancellation
- ``migrate``: squashing ("migrating") a local image into the squashed store, and removing it
"""
