"""The old path of ``podman-hpc-hook``'s entry point (``jupyter_podman_hpc.engine.hook:main``).

The console script of an install made before the engine had rooms (an editable install
is not regenerated when the package changes) names this module, and the OCI hook file
in ``hooks_dir`` runs that script: it keeps working until the package is installed again.
The hook itself is ``site.hook``.
"""

from .site.hook import main

__all__ = ["main"]
