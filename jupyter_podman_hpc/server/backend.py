"""What the REST API does, as plain methods returning JSON-able data (handlers stay thin).

Every operation is an engine or job-API call; the server only adds its
settings (traitlets), its root directory and background tasks.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from traitlets import Int, Unicode
from traitlets.config import Configurable

from ..engine.errors import EngineError
from ..engine.podman import Podman
from ..engine.service.taskrecords import TaskRecords
from ..engine.site.config import SiteConfig, load_config
from ..engine.site.modules import ModuleSet
from .tasks import Task, TaskManager


class PodmanHPC(Configurable):
    """Settings of the podman-hpc server extension (``c.PodmanHPC.<name>`` in the Jupyter config)."""

    config_file = Unicode("", help="The podman-hpc configuration file (as PODMANHPC_CONFIG_FILE).").tag(config=True)
    squash_dir = Unicode("", help="The squashed image store (default: SQUASH_DIR, else $SCRATCH/storage).").tag(
        config=True
    )
    job_root = Unicode("", help="Where job directories go (default: $SCRATCH/podman-hpc/jobs).").tag(config=True)
    default_partition = Unicode("", help="The partition the UI proposes.").tag(config=True)
    default_account = Unicode("", help="The account the UI proposes.").tag(config=True)
    default_time = Unicode("00:10:00", help="The time limit the UI proposes.").tag(config=True)
    default_nodes = Int(1, help="The node count the UI proposes.").tag(config=True)
    default_tasks_per_node = Int(1, help="The tasks per node the UI proposes.").tag(config=True)
    max_nodes = Int(64, help="The most nodes a user may request from the UI.").tag(config=True)
    max_tasks_per_node = Int(256, help="The most tasks per node a user may request from the UI.").tag(config=True)
    max_containerfile_bytes = Int(256_000, help="The largest Containerfile accepted.").tag(config=True)
    kernel_pool = Int(
        1,
        help="Container kernels kept started ahead of need per kernelspec that sets no "
        "pool size of its own (its `pool`, `kernel install --pool N`): a user's first "
        "kernel of an image is ready at once instead of after a container start. Each "
        "costs one idle container (ipykernel imported) per container kernelspec and "
        "server; 0 starts every kernel on demand.",
    ).tag(config=True)


class Backend:
    """The server's podman-hpc: configuration, images, builds, jobs and kernels."""

    def __init__(self, settings: PodmanHPC, root_dir: str, log=None):
        self.settings = settings
        self.root_dir = root_dir
        self.log = log or logging.getLogger(__name__)
        self.tasks = TaskManager(log=log, records=self._task_records(log))
        self._warming: list[threading.Thread] = []
        self._pools_closing = threading.Event()

    def _task_records(self, log) -> TaskRecords | None:
        """The user's task records (``engine.service.taskrecords``), or None when the run root cannot hold
        them (the server then keeps its tasks in memory only, and says why in its log)."""
        try:
            return TaskRecords.for_run_root(self.site().run_root)
        except (EngineError, OSError) as err:
            if log:
                log.warning("podman-hpc: tasks are not recorded on disk: %s", err)
            return None

    # --- engine configuration -------------------------------------------------

    def environ(self) -> dict[str, str]:
        """The environment engine calls run with: the server's, and the configuration file the server's
        settings name (``PODMANHPC_CONFIG_FILE``)."""
        env = dict(os.environ)
        if self.settings.config_file:
            env["PODMANHPC_CONFIG_FILE"] = self.settings.config_file
        return env

    def site(self) -> SiteConfig:
        """The site configuration as of now (read again at each call, so that an edit applies without a
        restart)."""
        return load_config(self.environ(), squash_dir=self.settings.squash_dir or None)

    def podman(self) -> Podman:
        """Podman for this user with the current site configuration."""
        return Podman(self.site(), self.environ())

    @staticmethod
    def writable_store(config: SiteConfig) -> SiteConfig:
        """``config`` if its squashed store takes writes from this user; else PermissionDenied
        (a 403) before any task starts."""
        from ..engine.store.access import check_writable

        check_writable(config.squash_dir)
        return config

    def job_root(self) -> Path:
        """Where the server's jobs live: the ``job_root`` setting, else the user's default job directory."""
        from ..slurm import default_root

        return Path(self.settings.job_root) if self.settings.job_root else default_root(self.environ())

    # --- images ----------------------------------------------------------------

    def images(self) -> list[dict]:
        """The user's images (local and squashed) as JSON-ready data, one per image."""
        from ..engine.images.catalog import list_images

        return [image.as_dict() for image in list_images(self.podman())]

    def pull(self, image: str, squash: bool) -> Task:
        """Start pulling ``image`` as a task (and squash it into the user's store with ``squash``, checked
        writable first); the task, whose result names the image id."""
        from ..engine.images.pull import pull, pull_and_squash

        config = self.writable_store(self.site()) if squash else self.site()

        def work(progress, cancel):
            if squash:
                result = pull_and_squash(config, image, progress, cancel=cancel)
                return {"image": image, "id": result.image_id, "squashed": True}
            return {"image": image, "id": pull(config, image, progress, cancel=cancel), "squashed": False}

        return self.tasks.start("pull", f"pull {image}", work)

    def build(
        self, containerfile: str, tag: str, build_args: dict[str, str], context: Path | None, squash: bool
    ) -> Task:
        """Start building ``containerfile`` (its text) as ``tag`` in ``context`` as a task, squashed after
        with ``squash`` (the store checked writable first); the task, whose result names the image id."""
        from ..engine.images.build import build, build_and_squash

        config = self.writable_store(self.site()) if squash else self.site()

        def work(progress, cancel):
            if squash:
                built = build_and_squash(
                    config, containerfile, tag, context, build_args, progress, cancel=cancel, environ=self.environ()
                )
                return {"image": tag, "id": built.image_id, "squashed": True}
            image_id = build(config, containerfile, tag, context, build_args, progress, cancel=cancel)
            return {"image": tag, "id": image_id, "squashed": False}

        return self.tasks.start("build", f"build {tag}", work)

    def squash(self, image: str) -> Task:
        """Start squashing the local ``image`` into the user's store as a task (the store checked writable
        first); its result says whether it was squashed already."""
        from ..engine.images.migrate import migrate

        podman = Podman(self.writable_store(self.site()), self.environ())

        def work(progress, cancel):
            result = migrate(podman, image, progress)
            return {"image": image, "id": result.image.id, "squashed": True, "already": not result.squashed}

        return self.tasks.start("squash", f"squash {image}", work)

    def remove_squashed(self, image: str) -> dict:
        """Remove ``image`` from the squashed store now (a name; the last name or an id: the image): its id,
        and whether its data was deleted."""
        from ..engine.images.migrate import remove_squashed

        removed, deleted = remove_squashed(self.podman(), image)
        return {"image": image, "id": removed.id, "deleted": deleted}

    # --- jobs ------------------------------------------------------------------

    def _spec(self, data: dict):
        from ..slurm import JobSpec

        return JobSpec.from_dict(data)

    def preview(self, data: dict) -> str:
        """The batch script a job of spec ``data`` would submit, without submitting it; JobSpecError for a
        bad spec."""
        from ..slurm import Job

        return Job.preview(self._spec(data), self.job_root(), config=self.site(), environ=self.environ())

    def submit(self, data: dict) -> dict:
        """Submit a job of spec ``data`` under the job root; the job with its Slurm status."""
        from ..slurm import Job, SlurmClient

        spec = self._spec(data)
        config = self.site()
        job = Job.submit(spec, self.job_root(), client=SlurmClient(env=self.environ()), config=config)
        return job.as_dict(status=True)

    def jobs(self, problems: list[str] | None = None) -> list[dict]:
        """The jobs, newest first; an unreadable job record is left out and described in ``problems``."""
        from ..slurm import Job, SlurmClient

        jobs = Job.list(self.job_root(), client=SlurmClient(env=self.environ()), problems=problems)
        return [job.as_dict() for job in reversed(jobs)]

    def _job(self, job_id: str):
        from ..slurm import Job, SlurmClient

        return Job.find(job_id, self.job_root(), client=SlurmClient(env=self.environ()))

    def job(self, job_id: str) -> dict:
        """The job ``job_id`` with its Slurm status; JobNotFound if it is not under the job root."""
        return self._job(job_id).as_dict(status=True)

    def logs(self, job_id: str) -> dict:
        """The job's output so far: each rank's stdout and stderr, and the batch script's log."""
        job = self._job(job_id)
        return {
            "id": job.id,
            "ranks": {str(rank): text for rank, text in sorted(job.logs().items())},
            "errors": {str(rank): text for rank, text in sorted(job.logs("err").items())},
            "batch": job.batch_log(),
        }

    def output(self, job_id: str) -> dict:
        """The job's output notebook: where it is, rank 0's progress, and its content."""
        from ..engine.errors import NotFound
        from ..slurm.notebook import read_output

        job = self._job(job_id)
        info = job.output_notebook()
        if info is None:
            raise NotFound(f"job {job.id} did not run a notebook: it has no output notebook")
        try:
            content = read_output(info)
        except FileNotFoundError:
            raise NotFound(f"job {job.id} has no output notebook yet: rank 0 writes it when the job starts")
        except (OSError, ValueError) as err:
            raise NotFound(f"the output notebook of job {job.id} cannot be read: {err}")
        return {"id": job.id, **info, "content": content}

    def cancel(self, job_id: str) -> dict:
        """Cancel the job ``job_id`` (scancel); the job with its status after."""
        job = self._job(job_id)
        job.cancel()
        return job.as_dict(status=True)

    # --- interactive clusters ----------------------------------------------------

    def _cluster_roots(self) -> list[Path]:
        """Where clusters are recorded: this server's job root, and the one kernels use ($SCRATCH's)."""
        from ..slurm import JobError, default_root

        roots = [self.job_root()]
        try:
            roots.append(default_root(self.environ()))
        except JobError:
            pass
        return list(dict.fromkeys(roots))

    def clusters(self) -> list[dict]:
        """The running clusters (started from any kernel of the user), after sweeping orphaned ones."""
        from ..slurm import SlurmClient
        from ..slurm import cluster as clusters

        client = SlurmClient(env=self.environ())
        found = []
        for root in self._cluster_roots():
            clusters.sweep(root, client=client)
            found += clusters.list_clusters(root, client=client)
        return [cluster.as_dict() for cluster in sorted(found, key=lambda c: -c.record.created)]

    def stop_cluster(self, cluster_id: str) -> dict:
        """Stop the cluster ``cluster_id`` (its id or job id), found in any of the server's cluster roots;
        the cluster after. ClusterNotFound if none has it."""
        from ..slurm import SlurmClient
        from ..slurm import cluster as clusters

        client = SlurmClient(env=self.environ())
        for root in self._cluster_roots():
            try:
                found = clusters.find_cluster(cluster_id, root, client=client)
            except clusters.ClusterNotFound:
                continue
            found.stop()
            return found.as_dict()
        raise clusters.ClusterNotFound(f"no cluster {cluster_id!r}")

    # --- kernels ---------------------------------------------------------------

    def kernels(self, problems: list[str] | None = None) -> list[dict]:
        """The container kernelspecs; a broken one is left out and described in ``problems``."""
        from ..kernels import kernelspec

        return [kernel.as_dict() for kernel in kernelspec.list_kernels(problems=problems)]

    def install_kernel(
        self, image: str, display_name: str | None, modules: list[str], name: str | None, pool: int | None = None
    ) -> dict:
        """Install a container kernel of ``image`` for this user, and warm its pool when it has one; the
        kernel as JSON-ready data."""
        from ..kernels import kernelspec

        kernel = kernelspec.install(image, name=name, display_name=display_name, modules=modules, pool=pool)
        if (kernel.pool if kernel.pool is not None else self.settings.kernel_pool) > 0:
            self.warm_kernel_pools([kernel.name])
        return kernel.as_dict()

    # --- warm kernel pools (kernels/pool.py) ----------------------------------------------

    def start_kernel_pools(self, spec_manager=None) -> None:
        """The server starts: ``kernel_pool`` becomes its process's pool size for kernelspecs that set
        none, pool containers mount the root directory besides $HOME, and every pool starts, but those of
        kernelspecs that others than the user and root could have written (``warm_kernel_pools``)."""
        from ..kernels import kernelspec, pool

        pool.default_size = self.settings.kernel_pool
        pool.default_dirs = (os.path.realpath(self.root_dir),)
        self.warm_kernel_pools(
            [
                kernel.name
                for kernel in kernelspec.list_kernels()
                if (kernel.pool if kernel.pool is not None else pool.default_size) > 0
            ],
            spec_manager,
        )

    def warm_kernel_pools(self, names: list[str], spec_manager=None) -> None:
        """Start the pools of kernelspecs ``names`` now, not at their first kernel, in the background;
        a kernelspec that others than the user and root could have written gets none (its kernels start
        when picked), and one warning line saying which path and who else may write it."""
        from jupyter_client.kernelspec import KernelSpecManager

        from ..kernels.provisioner import PodmanHPCProvisioner

        def warm():
            manager = spec_manager or KernelSpecManager()
            for name in names:
                if self._pools_closing.is_set():
                    return
                try:
                    PodmanHPCProvisioner.warm(name, manager, self.settings.config, self.log)
                except Exception as err:  # noqa: BLE001 - its kernels then start on demand
                    self.log.warning("podman-hpc: no kernel pool for %s: %s", name, err)

        thread = threading.Thread(target=warm, name="podman-hpc-kernel-pools", daemon=True)
        self._warming.append(thread)
        thread.start()

    def close_kernel_pools(self) -> None:
        """The server stops: no pool starts any more, every pool of this process closes, and the process
        goes back to pooling no kernelspec by default (pytest-jupyter runs servers one after another)."""
        from ..kernels import pool

        self._pools_closing.set()
        for thread in self._warming:
            thread.join(60)
        pool.default_size, pool.default_dirs = 0, ()
        pool.close_all()

    def remove_kernel(self, name: str) -> dict:
        """Remove this user's container kernel ``name``; the kernel removed."""
        from ..kernels import kernelspec

        return kernelspec.remove(name).as_dict()

    # --- what the UI needs -------------------------------------------------------

    def ui_config(self) -> dict:
        """What the Lab panel needs to draw its forms: defaults, limits, the site's modules and Slurm
        partitions (each with the error that kept it from being read, if any), the squash and job
        directories, the run modes."""
        config = self.site()
        s = self.settings
        modules, module_error = self._ui_modules(config)
        partitions, slurm_error = self._ui_partitions()
        default_partition = s.default_partition or next((p["name"] for p in partitions if p.get("default")), "")
        return {
            "defaults": {
                "nodes": s.default_nodes,
                "tasks_per_node": s.default_tasks_per_node,
                "time": s.default_time,
                "partition": default_partition,
                "account": s.default_account,
                "mode": "podman-exec",
            },
            "limits": {
                "max_nodes": s.max_nodes,
                "max_tasks_per_node": s.max_tasks_per_node,
                "max_containerfile_bytes": s.max_containerfile_bytes,
            },
            "modules": modules,
            "module_error": module_error,
            "partitions": partitions,
            "slurm_error": slurm_error,
            "squash_dir": config.squash_dir,
            "job_root": str(self.job_root()),
            "modes": ["podman-exec", "per-process"],
        }

    @staticmethod
    def _ui_modules(config: SiteConfig) -> tuple[list[dict], str | None]:
        """The site's modules a user can ask for by name, described; or none and the error that kept them
        from being read."""
        try:
            modules = ModuleSet.load(config.modules_dir, cache_dir=config.run_root)
            return [m.describe() for m in modules if m.cli_arg and not m.hidden], None
        except EngineError as err:
            return [], str(err)

    def _ui_partitions(self) -> tuple[list[dict], str | None]:
        """Slurm's partitions; or none and the error that kept them from being read."""
        try:
            from ..slurm import SlurmClient

            return [p.as_dict() for p in SlurmClient(env=self.environ()).partitions()], None
        except EngineError as err:
            return [], str(err)
