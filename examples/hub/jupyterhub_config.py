"""JupyterHub for jupyter-podman-hpc, as an HPC centre runs it (docs/operators/site.md).

The hub runs on a login node. Users pick a profile on the spawn page:

- "Compute node": batchspawner's SlurmSpawner submits the single-user server as
  a Slurm job; the server runs on the node the job gets, where container
  kernels, `%podman_hpc run` and "Run at scale" run.
- "Login node": the server runs on the hub's own host, as a local process.

Hub and single-user servers run from one environment, the site environment,
installed from the project's wheel with jupyterhub, batchspawner and
wrapspawner (docs/operators/site.md, "Install from the wheel"). Start the hub with that
environment's jupyterhub: `$SITE_VENV/bin/jupyterhub -f jupyterhub_config.py`.

What changes from site to site is read from the environment here:

  JPH_SITE_VENV       the site environment (default: the one running this hub)
  JPH_HUB_PARTITION   the Slurm partition of the compute-node profile (default: the cluster's default)
  JPH_HUB_RUNTIME     the server job's time limit (default 1:00:00)
  JPH_HUB_NODE_IP     where the proxy reaches a server on a node; unset on a real cluster
                      (the node's name as squeue reports it). The cluster-in-a-box's nodes
                      share the login node's loopback, so its tests set 127.0.0.1.

A hub run as root starts each user's server as that user (sudo for the Slurm
commands, setuid for the login-node server), as batchspawner and JupyterHub
do by default. A hub run by an unprivileged user (the tests, a personal hub)
can only start servers as itself: then neither is used.

The site's authenticator (PAM, OAuth...) and TLS are set where marked below.
"""

import os
import sys

# Imported here, not only when a profile picks it: importing batchspawner registers the hub API
# handler (/hub/api/batchspawner) its servers report their port to, which must happen before
# the hub builds its handlers.
import batchspawner  # noqa: F401

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)

SITE_VENV = os.environ.get("JPH_SITE_VENV", sys.prefix)
BIN = os.path.join(SITE_VENV, "bin")
AS_ROOT = os.geteuid() == 0

# --- the hub on the login node --------------------------------------------------------
# The proxy serves users; the hub's API must be reachable from the compute nodes
# (single-user servers report to it). Here both listen on loopback only; on a real
# cluster set hub_ip (or hub_connect_ip) to the login node's address on the cluster network.
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.hub_ip = "127.0.0.1"
# The authenticator: the site's own, e.g. "pam" (the default) with allowed_users or groups.
# c.JupyterHub.authenticator_class = "pam"

# --- the single-user server ---------------------------------------------------------------
# From the site environment: its podman-hpc, kernel provisioner and lab extension are
# what the server uses on whichever node it runs (a batch script a notebook submits
# calls the podman-hpc beside the server's python).
c.Spawner.cmd = [os.path.join(BIN, "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
# Variables the server needs from the hub's environment (besides PATH, LANG...): the
# Slurm configuration where it is not /etc/slurm, the user's scratch (podman-hpc's
# squashed store defaults to $SCRATCH/storage) and podman-hpc's site configuration.
c.Spawner.env_keep.extend(["SLURM_CONF", "SCRATCH", "PODMANHPC_CONFIG_FILE"])
c.Spawner.environment = {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}
# A cold compute-node start: queueing, the job's start and the server's imports.
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 120

# --- the compute-node profile: batchspawner's SlurmSpawner -----------------------------
# The server's job takes one whole node (the partition allocates nodes exclusively),
# which counts against the user's node limits like any job; the jobs the server submits
# ("Run at scale", %podman_hpc submit, cluster start) get other nodes.
c.SlurmSpawner.batchspawner_singleuser_cmd = os.path.join(BIN, "batchspawner-singleuser")
c.SlurmSpawner.req_partition = os.environ.get("JPH_HUB_PARTITION", "")
c.SlurmSpawner.req_runtime = os.environ.get("JPH_HUB_RUNTIME", "1:00:00")
c.SlurmSpawner.req_options = "--nodes=1"
c.SlurmSpawner.batch_script = """#!/bin/bash
#SBATCH --job-name=jupyterhub-{{username}}
#SBATCH --output={{homedir}}/.jupyterhub-slurm-%j.log
#SBATCH --chdir={{homedir}}
#SBATCH --export={{keepvars}}
{% if partition %}#SBATCH --partition={{partition}}
{% endif %}{% if runtime %}#SBATCH --time={{runtime}}
{% endif %}{% if options %}#SBATCH {{options}}
{% endif %}
set -euo pipefail
trap 'echo SIGTERM received' TERM
{{prologue}}
{% if srun %}{{srun}} {% endif %}{{cmd}}
echo "jupyterhub-singleuser ended gracefully"
{{epilogue}}
"""
if not AS_ROOT:
    c.SlurmSpawner.exec_prefix = ""  # sbatch, squeue and scancel as the hub's own user
# The proxy reaches the server at the node's name from squeue (batchspawner's default: the
# server listens on every interface of its node), or at JPH_HUB_NODE_IP, where the server then
# listens only (the nodes of the cluster-in-a-box share the login node's loopback).
NODE_IP = os.environ.get("JPH_HUB_NODE_IP", "")
if NODE_IP:
    c.SlurmSpawner.state_exechost_exp = NODE_IP

# --- the login-node profile ------------------------------------------------------------
LOCAL_SPAWNER = "jupyterhub.spawner.LocalProcessSpawner" if AS_ROOT else "jupyterhub.spawner.SimpleLocalProcessSpawner"
if not AS_ROOT:
    c.SimpleLocalProcessSpawner.home_dir_template = "/home/{username}"

c.JupyterHub.spawner_class = "wrapspawner.ProfilesSpawner"
c.ProfilesSpawner.profiles = [
    # (what the spawn page shows, key, spawner class, that spawner's settings)
    (
        "Compute node (a Slurm job on one whole node)",
        "node",
        "batchspawner.SlurmSpawner",
        {"args": [f"--ip={NODE_IP}"]} if NODE_IP else {},
    ),
    ("Login node (shared, no Slurm job)", "login", LOCAL_SPAWNER, {}),
]
