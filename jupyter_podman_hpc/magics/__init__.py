"""IPython magics: podman-hpc from a notebook (``%load_ext jupyter_podman_hpc``).

``%podman_hpc COMMAND ...`` (line) and ``%%podman_hpc build ...`` (cell)::

    %%podman_hpc build -t myimage:1 --squash      # the cell body is the Containerfile
    %podman_hpc pull registry/name:tag            # then squashed
    %podman_hpc squash myimage:1                  # also: migrate; rmsqi removes
    images = %podman_hpc images                   # a list of records, shown as a table
    %podman_hpc run --openmpi-pmix myimage:1 python3 -c "print(1)"
    job = %podman_hpc submit --nodes 4 --tasks-per-node 2 --time 10 myimage:1 python3 app.py
    job                                           # a live status widget
    job.wait(); job.logs()
    %podman_hpc jobs | logs JOBID | cancel JOBID
    cluster = %podman_hpc cluster start --nodes 4 --tasks-per-node 2 IMAGE   # then %%px cells
    %podman_hpc cluster list | cluster stop [ID]
    %podman_hpc kernel install IMAGE | kernel list | kernel remove NAME
    %podman_hpc info

- ``parser``: the words of a line, parsed (argparse that raises instead of exiting)
- ``render``: the engine's Progress events as widgets or plain text, and when to use which
- ``display``: images and kernels as lists that show as tables
- ``jobs``: the Job a submit returns, with its live status widget
- ``core``: the magics, calling the engine and the job API
"""


def load_ipython_extension(ipython) -> None:
    """``%load_ext jupyter_podman_hpc``: register the ``%podman_hpc`` magics in this IPython shell."""
    from .core import PodmanHPCMagics

    ipython.register_magics(PodmanHPCMagics)
