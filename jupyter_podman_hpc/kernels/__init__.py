"""Container-backed Jupyter kernels: a kernel provisioner and kernelspec management.

- ``provisioner``: ``PodmanHPCProvisioner``, registered as the
  ``podman-hpc-provisioner`` kernel provisioner; its traits and a kernel's
  lifecycle, with ``podman-hpc run`` semantics
- ``container``: a kernel container's ``podman run`` command line (network,
  mounts, keep-id, environment, the boot program)
- ``spawn``: starting a kernel container: its attached ``podman run``, stderr
  drain and watchdog
- ``pool``: warm pools of a kernelspec's containers, and a kernel start
  adopting one
- ``boot``: the program that starts ipykernel inside the container
- ``orphans``: labels of kernel containers, the sweep of orphaned ones and
  the per-kernel watchdog
- ``kernelspec``: install, list and remove kernelspecs that use it
- ``cli``: ``jupyter podman-hpc kernel install|list|remove``

Importing this package stays cheap: the provisioner (which needs
jupyter_client) is imported only by its entry point.
"""

PROVISIONER_NAME = "podman-hpc-provisioner"
