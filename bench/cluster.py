"""Interactive cluster start-up: from the start call to every engine registered, 4 nodes x 2 engines.

Configurations, alternated over the repetitions:

- ``bare srun``: the same job's step bare, ``srun -N4 --ntasks-per-node=2 --mpi=pmix true``
  (wall time of the srun);
- ``bare engines``: an IPython Parallel controller here and the same srun running the
  virtual environment's ``python -m ipyparallel.engine`` on the nodes, no container,
  until all 8 registered (the cluster without podman-hpc);
- ``podman-hpc cluster``: ``Cluster.start`` (what ``%podman_hpc cluster start`` calls) of the
  base image with ``--module openmpi-pmix``, from a node-local storage that never pulled it:
  sbatch, the job's start, ``shared-run`` containers, engines registered. Its phases
  (``submitted``, ``job running`` (first seen), ``first engine``) are recorded as metrics too.

Stopping is not timed; every configuration leaves nothing behind before the next starts.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from common import Failure, PrivateStorage, Sample, alternating, ensure_pulled, pulled_store, store_env

BENCHMARK = "cluster"
CONFIGS = ["bare srun", "bare engines", "podman-hpc cluster"]
NODES, TASKS = 4, 2
MPI_ENV = {"OMPI_MCA_btl": "self,tcp", "OMPI_MCA_btl_tcp_if_include": "lo", "OMPI_MCA_oob_tcp_if_include": "lo"}
TIMEOUT = 300.0


def _srun() -> list[str]:
    return ["srun", f"-N{NODES}", f"--ntasks-per-node={TASKS}", "--mpi=pmix"]


def bare_srun(env: dict) -> dict[str, float]:
    started = time.monotonic()
    subprocess.run([*_srun(), "true"], env=env, check=True, capture_output=True, timeout=TIMEOUT)
    return {"start_seconds": time.monotonic() - started}


def bare_engines(work: Path, env: dict) -> dict[str, float]:
    import ipyparallel

    profile = work / f"bare-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    controller = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ipyparallel.controller",
            f"--profile-dir={profile}",
            "--ip=127.0.0.1",
            "--log-level=WARN",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    engines = None
    client = None
    try:
        files = [profile / "security" / f"ipcontroller-{kind}.json" for kind in ("client", "engine")]
        while not all(path.exists() for path in files):
            if controller.poll() is not None or time.monotonic() - started > 60:
                raise RuntimeError("the bare controller did not start")
            time.sleep(0.05)
        engines = subprocess.Popen(
            [*_srun(), sys.executable, "-m", "ipyparallel.engine", f"--file={files[1]}", "--log-level=WARN"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = ipyparallel.Client(str(files[0]), timeout=30)
        while len(client.ids) < NODES * TASKS:
            if engines.poll() is not None or time.monotonic() - started > TIMEOUT:
                raise RuntimeError("the bare engines did not all register")
            time.sleep(0.05)
        return {"start_seconds": time.monotonic() - started}
    finally:
        if client is not None:
            client.close()
        if engines is not None:
            engines.terminate()
            engines.wait(60)
        os.killpg(controller.pid, 15)
        controller.wait(30)
        shutil.rmtree(profile, ignore_errors=True)


def podman_hpc_cluster(image: str, env: dict, root: Path) -> dict[str, float]:
    from jupyter_podman_hpc.slurm import SlurmClient
    from jupyter_podman_hpc.slurm.cluster import Cluster

    phases: dict[str, float] = {}
    started = time.monotonic()

    def progress(event) -> None:
        now = time.monotonic() - started
        if "RUNNING" in event.message:
            phases.setdefault("job_running_seconds", now)
        if (event.current or 0) >= 1:
            phases.setdefault("first_engine_seconds", now)

    engine_vars = {
        k: env[k] for k in ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")
    }
    cluster = Cluster.start(
        image,
        nodes=NODES,
        tasks_per_node=TASKS,
        time="10",
        modules=("openmpi-pmix",),
        environment={**MPI_ENV, **engine_vars},
        partition=env.get("STACK_PARTITION"),
        root=root,
        client=SlurmClient(env=env),
        progress=progress,
        timeout=TIMEOUT,
    )
    total = time.monotonic() - started
    cluster.stop()
    return {"start_seconds": total, **phases}


def measure(image: str, work: Path, repetitions: int, failures: list[Failure], log=print) -> list[Sample]:
    ensure_pulled(image, log)
    storage = PrivateStorage(f"cluster-{uuid.uuid4().hex[:8]}")  # compute nodes that never pulled it
    env = storage.env(store_env(pulled_store()))
    root = work / "cluster-jobs"
    size = f"{NODES}x{TASKS}"
    samples: list[Sample] = []
    try:
        for repetition in range(repetitions):
            for config in alternating(CONFIGS, repetition):
                try:
                    if config == "bare srun":
                        values = bare_srun(env)
                    elif config == "bare engines":
                        values = bare_engines(work, env)
                    else:
                        values = podman_hpc_cluster(image, env, root)
                except Exception as err:  # noqa: BLE001  one failed start is reported, the others still run
                    failures.append(Failure(BENCHMARK, config, size, repetition, f"{type(err).__name__}: {err}"))
                    log(f"cluster {config}: FAILED {err}")
                    continue
                log(f"cluster {config} {size} #{repetition}: " + ", ".join(f"{k} {v:.2f}" for k, v in values.items()))
                samples += [
                    Sample(BENCHMARK, config, size, repetition, metric, value) for metric, value in values.items()
                ]
    finally:
        storage.remove()
    return samples
