"""Container-backed Jupyter kernels: a kernel provisioner and kernelspec management.

- ``provisioner``: ``PodmanHPCProvisioner``, registered as the
  ``podman-hpc-provisioner`` kernel provisioner; runs an image's ipykernel
  with ``podman-hpc run`` semantics
- ``orphans``: labels of kernel containers, the sweep of orphaned ones and
  the per-kernel watchdog
- ``kernelspec``: install, list and remove kernelspecs that use it
- ``cli``: ``jupyter podman-hpc kernel install|list|remove``

Importing this package stays cheap: the provisioner (which needs
jupyter_client) is imported only by its entry point.
"""

PROVISIONER_NAME = "podman-hpc-provisioner"
