"""Running containers: the plan every front shares, and the containers of Slurm tasks.

Nothing is imported here: a task that joins its node's container (``jupyter_podman_hpc.rank``)
imports ``join`` and must load nothing else.

- ``plan``: how a container run is planned, once for the CLI, the magics and kernels
- ``launcher``: shared-run (podman-exec): a step's tasks on a node, the first one starting its container
- ``stepcontext``: where a task sits in its Slurm step (node, rank, step key, PMI passthrough)
- ``taskplan``: what a task runs in the container (entrypoint, CMD, environment, options)
- ``stepmonitor``: the node's step monitor: serves the other tasks their plan, removes the container
- ``jobcontainer``: a job's node container its steps share (``--reuse``): its locks, adopt or start, linger and removal
- ``perprocess``: per-process mode (one ``podman run`` per task)
- ``join``: running a task inside the node's container by joining its namespaces
"""
