"""What the tests share besides fixtures: plain functions, classes and constants, one module per
role. Test modules and conftest files import them from here; conftest files hold only fixtures
and hooks, and no test module imports from a conftest (tests/unit/test_tests_layout.py).

- ``stack``: the cluster-in-a-box as the tests see it, and a missing part's skip or failure
- ``commands``: running a command with its output in the failure
- ``site_modules``: site modules (modules.d) made for a test
- ``hpc``: podman-hpc with private storage per test, squashed stores, a job's store variables
- ``peer``: podman-hpc 1.2.2, the upstream tool, as a peer
- ``kernel_site``: a kernel site on a squashed store with throwaway Jupyter directories
- ``servers``: Jupyter servers as processes, reached over HTTP and WebSocket
- ``hubs``: a test JupyterHub and its API
- ``kernel_clients``: a kernel started and driven with jupyter_client
- ``pools``: warm pools of kernel containers
- ``magics_kernel``: an IPython kernel with the magics loaded, and what its cells show
- ``server_extension``: our server extension in-process: its configuration, API, tasks and events
- ``launcher_steps``: a recording podman, an allocation of every node, steps and their monitors
- ``faults``: one line a user reads, own mounts, a file system that fills up, a registry front
- ``browser``: a real JupyterLab, one on the stack, and a page's console
- ``attacks``: what the attack tests share: a project store as an Hpc's store, an image built
- ``slurm_standin``: a stand-in for Slurm and a submit without a cluster
- ``notebook_jobs``: a notebook job whose ranks run the runner as subprocesses
- ``squash_files``: squash files made with mksquashfs and their unpacked copies
- ``store_images``: images squashed into a store as migrate leaves them
- ``sweeps``: a stand-in for Podman that records what a sweep removes
"""
