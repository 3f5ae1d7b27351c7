"""The ``%podman_hpc`` line magic and ``%%podman_hpc`` cell magic.

Each subcommand parses its words (``parser``), calls the engine or the job
API, and renders the engine's progress (``render``); it adds no logic of
its own. Errors become ``MagicError``: IPython shows it as one short message
(no traceback) and the cell fails, so "Run all" stops there as it would on
an exception; ``--debug`` re-raises the original exception instead.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import signal
import subprocess
import sys
from argparse import Namespace
from collections.abc import Iterator
from pathlib import Path

from IPython.core.magic import Magics, line_cell_magic, magics_class

from ..engine.base import commands
from ..engine.errors import EngineError
from .parser import HelpRequested, MagicError, parse, subparser
from .render import Renderer, make_renderer

STDERR_TAIL = 8192  # bytes of a run's stderr kept for its error message


def _usage(command: str) -> str:
    found = subparser(command)
    return found.format_usage() if found is not None else ""


@contextlib.contextmanager
def _rendering(renderer: Renderer) -> Iterator[Renderer]:
    try:
        yield renderer
    except EngineError as err:
        renderer.failed(str(err), getattr(err, "output", "") or "")
        raise
    except KeyboardInterrupt:
        renderer.failed("interrupted")
        raise
    finally:
        renderer.close()


@magics_class
class PodmanHPCMagics(Magics):
    """``%podman_hpc COMMAND ...`` (``%podman_hpc help`` lists the commands)."""

    def __init__(self, shell=None, **kwargs):
        super().__init__(shell, **kwargs)
        self.last_renderer: Renderer | None = None  # the last progress renderer (for tests and debugging)

    @line_cell_magic
    def podman_hpc(self, line: str, cell: str | None = None):
        """podman-hpc from a notebook: build, pull, squash, images, run, submit, jobs, kernels.

        ``%podman_hpc help`` lists the commands, ``%podman_hpc help COMMAND`` shows one's
        options. Add ``--debug`` to see the full traceback of an error.
        """
        try:
            args = parse(line)
        except HelpRequested as request:
            print(request.text.rstrip())
            return None
        handler = getattr(self, f"_cmd_{args.command}")
        try:
            # --debug also shows each command the engine runs, as it ends
            with commands.logged_to(sys.stderr) if args.debug else contextlib.nullcontext():
                return handler(args, cell)
        except (MagicError, KeyboardInterrupt):
            raise
        except EngineError as err:
            if args.debug:
                raise
            raise MagicError(str(err)) from None
        except Exception as err:
            if args.debug:
                raise
            raise MagicError(f"{type(err).__name__}: {err} (add --debug to see where)") from None

    # --- helpers ----------------------------------------------------------------------

    @staticmethod
    def _config():
        from ..engine.site.config import load_config

        return load_config(os.environ)

    def _renderer(self, title: str, **kwargs) -> Renderer:
        self.last_renderer = make_renderer(title, **kwargs)
        return self.last_renderer

    @staticmethod
    def _no_cell(args: Namespace, cell: str | None) -> None:
        if cell is not None and cell.strip():
            raise MagicError(f"{args.command} takes no cell body (only build does)", _usage(args.command))

    # --- images -----------------------------------------------------------------------

    def _cmd_build(self, args: Namespace, cell: str | None):
        from ..engine.images.build import build, build_and_squash

        if args.file:
            if cell is not None and cell.strip():
                raise MagicError(
                    "give the Containerfile either as the cell body or with --file, not both", _usage("build")
                )
            try:
                containerfile = Path(args.file).expanduser().read_text()
            except OSError as err:
                raise MagicError(f"cannot read {args.file}: {err.strerror}")
        elif cell is None or not cell.strip():
            raise MagicError(
                "build needs a Containerfile: write it in the cell body of %%podman_hpc build (or give --file PATH)",
                _usage("build"),
            )
        else:
            containerfile = cell
        config = self._config()
        renderer = self._renderer(f"build {args.tag}", log=args.log)
        with _rendering(renderer):
            if args.squash:
                built = build_and_squash(
                    config,
                    containerfile,
                    args.tag,
                    args.context,
                    dict(args.build_args),
                    renderer,
                    no_cache=args.no_cache,
                    environ=os.environ,
                )
                _squashed(renderer, config, args.tag, built.squash)
            else:
                image_id = build(
                    config,
                    containerfile,
                    args.tag,
                    args.context,
                    dict(args.build_args),
                    renderer,
                    no_cache=args.no_cache,
                )
                renderer.done(f"Built {args.tag} ({image_id[:12]})")
        return None

    def _squash(self, config, ref: str, renderer: Renderer) -> None:
        from ..engine.images.migrate import migrate
        from ..engine.podman import Podman

        renderer.note(f"Squashing {ref}")
        _squashed(renderer, config, ref, migrate(Podman(config, os.environ), ref, renderer))

    def _cmd_pull(self, args: Namespace, cell: str | None):
        from ..engine.images.pull import pull, pull_and_squash

        self._no_cell(args, cell)
        config = self._config()
        renderer = self._renderer(f"pull {args.image}")
        with _rendering(renderer):
            if args.no_squash:
                image_id = pull(config, args.image, renderer)
                renderer.done(f"Pulled {args.image} ({image_id[:12]})")
            else:
                _squashed(renderer, config, args.image, pull_and_squash(config, args.image, renderer).squash)
        return None

    def _cmd_squash(self, args: Namespace, cell: str | None):
        self._no_cell(args, cell)
        config = self._config()
        renderer = self._renderer(f"squash {args.image}")
        with _rendering(renderer):
            self._squash(config, args.image, renderer)
        return None

    _cmd_migrate = _cmd_squash

    def _cmd_rmsqi(self, args: Namespace, cell: str | None):
        from ..engine.images.migrate import remove_squashed
        from ..engine.podman import Podman

        self._no_cell(args, cell)
        config = self._config()
        image, deleted = remove_squashed(Podman(config, os.environ), args.image)
        if deleted:
            print(f"Removed {args.image} ({image.short_id}) from {config.squash_dir}")
        else:
            print(f"Untagged {args.image} ({image.short_id}) in {config.squash_dir}")
        return None

    def _cmd_images(self, args: Namespace, cell: str | None):
        from ..engine.images.catalog import list_images
        from ..engine.podman import Podman
        from .display import ImageList

        self._no_cell(args, cell)
        images = list_images(Podman(self._config(), os.environ))
        if args.filter:
            text = args.filter
            images = [i for i in images if any(text in name for name in i.names) or i.id.startswith(text)]
        return ImageList(images)

    # --- run ----------------------------------------------------------------------------

    def _cmd_run(self, args: Namespace, cell: str | None):
        from ..engine.run.plan import Site

        self._no_cell(args, cell)
        site = Site.load(os.environ)
        plan = site.plan(args.args, front_flags=["--debug"])
        if plan.flags:
            args.debug = True
        if plan.image is None:
            raise MagicError("run needs an IMAGE", _usage("run"))
        shared = [m for m in plan.modules if m.shared_run]
        if shared:
            raise MagicError(
                f"module '{shared[0].name}' ({shared[0].flag}) runs one container per node "
                "under Slurm: use %podman_hpc submit"
            )
        # a cell run leaves no container behind
        keep = any(o.split("=", 1)[0] in ("--rm", "-d", "--detach") for o in plan.options)
        argv = site.run_argv(plan, [] if keep else ["--rm"])
        code, stderr = stream(argv, site.podman.env)
        if code != 0:
            from ..engine.podman import error_message

            podman_said = [line for line in stderr.splitlines() if line.strip().startswith("Error:")]
            if podman_said:
                raise MagicError(f"{error_message(stderr)} (exit code {code})")
            raise MagicError(f"the command exited with code {code}")
        return None

    # --- jobs ---------------------------------------------------------------------------

    @staticmethod
    def _job_fields(args: Namespace) -> dict:
        """The JobSpec fields of the options submit and cluster start share."""
        environment: dict[str, str] = {}
        for key, value in args.env:
            if value is None:
                if key not in os.environ:
                    raise MagicError(f"--env {key}: {key} is not set in this kernel (give {key}=VALUE)")
                value = os.environ[key]
            environment[key] = value
        return {
            "nodes": args.nodes,
            "tasks_per_node": args.tasks_per_node,
            "cpus_per_task": args.cpus_per_task,
            "gpus_per_node": args.gpus_per_node,
            "time": args.time,
            "partition": args.partition,
            "account": args.account,
            "qos": args.qos,
            "reservation": args.reservation,
            "modules": tuple(args.modules),
            "environment": environment,
            "extra_directives": tuple(args.directives),
            "job_name": args.job_name,
        }

    def _spec(self, args: Namespace):
        from ..slurm import JobSpec

        return JobSpec(
            image=args.image,
            command=tuple(args.argv) if args.argv else None,
            python_script=args.script,
            notebook=args.notebook,
            args=tuple(args.args),
            parameters=dict(args.params),
            workdir=args.workdir,
            mode=args.mode,
            **self._job_fields(args),
        )

    def _cmd_submit(self, args: Namespace, cell: str | None):
        from ..slurm import Job as SlurmJob
        from ..slurm import SlurmClient
        from .jobs import Job

        self._no_cell(args, cell)
        spec = self._spec(args)
        config = self._config()
        if args.preview:
            print(SlurmJob.preview(spec, config=config, environ=os.environ).rstrip())
            return None
        notes: list[str] = []

        def progress(event) -> None:
            if event.message and not event.message.startswith(("submitting", "submitted")):
                notes.append(event.message)

        job = SlurmJob.submit(spec, client=SlurmClient(), config=config, progress=progress)
        for note in notes:
            print(note)
        print(
            f"Submitted job {job.id} ({spec.nodes} node(s) x {spec.tasks_per_node} task(s), {spec.mode}) "
            f"in {job.directory}"
        )
        output = job.output_notebook()
        if output:
            print(f"Output notebook (rank 0 writes it as cells run): {output['path']}")
        return Job(job)

    @staticmethod
    def _find(job_id: str):
        from ..slurm import Job as SlurmJob
        from ..slurm import SlurmClient

        return SlurmJob.find(job_id, client=SlurmClient())

    def _cmd_jobs(self, args: Namespace, cell: str | None):
        from .jobs import JobList

        self._no_cell(args, cell)
        return JobList.load()

    def _cmd_logs(self, args: Namespace, cell: str | None):
        self._no_cell(args, cell)
        job = self._find(args.job_id)
        output = job.output_notebook()
        if output:
            from ..slurm.notebook import describe_progress

            state = describe_progress(output) or ("not written yet" if not output["exists"] else "")
            print(f"Output notebook: {output['path']}" + (f" ({state})" if state else ""))
        text = job.batch_log() if args.batch else job.labelled_output("err" if args.err else "out")
        if text:
            print(text.rstrip("\n"))
        else:
            what = "Slurm's log" if args.batch else "standard error" if args.err else "output"
            print(f"No {what} from job {job.id} (yet)")
        return None

    def _cmd_cancel(self, args: Namespace, cell: str | None):
        self._no_cell(args, cell)
        job = self._find(args.job_id)
        job.cancel()
        print(f"Cancelled job {job.id}")
        return None

    # --- interactive clusters ----------------------------------------------------------

    def _cmd_cluster(self, args: Namespace, cell: str | None):
        from ..slurm import SlurmClient
        from ..slurm import cluster as clusters

        self._no_cell(args, cell)
        if args.action == "start":
            config = self._config()
            renderer = self._renderer(f"cluster of {args.nodes * args.tasks_per_node} engines in {args.image}")
            with _rendering(renderer):
                cluster = clusters.Cluster.start(
                    args.image,
                    controller_ip=args.controller_ip,
                    timeout=args.timeout,
                    client=SlurmClient(),
                    config=config,
                    progress=renderer,
                    **self._job_fields(args),
                )
                if self.shell is not None:
                    view = cluster.client()[:]
                    view.block = True  # a %%px cell ends when every engine has run it
                    view.activate()  # %px, %%px and %autopx now run on its engines
                renderer.done(
                    f"Cluster {cluster.id}: {cluster.record.engines} engines, job {cluster.job_id}; %%px runs on them"
                )
            return cluster
        if args.action == "list":
            found = clusters.list_clusters(client=SlurmClient()) if args.all else clusters.started_here()
            if not found:
                print("No running clusters" + ("" if args.all else " started by this kernel"))
            for cluster in found:
                data = cluster.as_dict()
                ended = "  ended: stop it to clear it" if data["state"] == "ended" else ""
                print(
                    f"{data['id']}  job {data['job_id']} {data['job_state'] or ''}  {data['registered']}/"
                    f"{data['engines']} engines  {data['nodelist']}  {data['image']}{ended}"
                )
            return None
        if args.all:
            targets = clusters.started_here()
        elif args.cluster_id:
            targets = [clusters.find_cluster(args.cluster_id, client=SlurmClient())]
        else:
            targets = clusters.started_here()[-1:]
            if not targets:
                raise MagicError("this kernel has no running cluster (give a cluster ID, see cluster list --all)")
        for cluster in targets:
            cluster.stop()
            print(f"Stopped cluster {cluster.id} (job {cluster.job_id})")
        return None

    # --- kernels, info ------------------------------------------------------------------

    def _cmd_kernel(self, args: Namespace, cell: str | None):
        from ..kernels import kernelspec
        from .display import KernelList

        self._no_cell(args, cell)
        if args.action == "install":
            kernel = kernelspec.install(
                args.image, name=args.name, display_name=args.display_name, modules=args.modules
            )
            print(f"Installed kernel {kernel.name} ({kernel.display_name}) in {kernel.path}")
            return None
        if args.action == "list":
            return KernelList(kernelspec.list_kernels())
        kernel = kernelspec.remove(args.name)
        print(f"Removed kernel {kernel.name} from {kernel.path}")
        return None

    def _cmd_info(self, args: Namespace, cell: str | None):
        from ..engine.info import report
        from ..engine.run.plan import Site

        self._no_cell(args, cell)
        for line in report(Site.load(dict(os.environ))):
            print(line)
        return None


def _squashed(renderer: Renderer, config, ref: str, result) -> None:
    """The last line of a squash: done now, or found in the store already."""
    if result.squashed:
        renderer.done(f"Squashed {ref} ({result.image.short_id}) into {config.squash_dir}")
    else:
        renderer.done(f"{ref} ({result.image.short_id}) is already in the squashed store {config.squash_dir}")


def stream(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv``, copying its stdout and stderr to ours as they come; (exit code, stderr's tail).

    An interrupt (the kernel's stop button) stops the process (SIGTERM, then SIGKILL
    after 10 s; podman passes the signal to the container) and is raised again.
    """
    try:
        process = commands.popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except FileNotFoundError:
        raise MagicError(f"{argv[0]} not found (set podman_bin in the site configuration)")
    tail = b""
    decoders = {}
    with selectors.DefaultSelector() as selector:
        for pipe, target in ((process.stdout, "stdout"), (process.stderr, "stderr")):
            os.set_blocking(pipe.fileno(), False)
            selector.register(pipe, selectors.EVENT_READ, target)
            decoders[target] = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            while selector.get_map():
                for key, _ in selector.select():
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        selector.unregister(key.fileobj)
                        text = decoders[key.data].decode(b"", final=True)
                    else:
                        text = decoders[key.data].decode(chunk)
                        if key.data == "stderr":
                            tail = (tail + chunk)[-STDERR_TAIL:]
                    if text:
                        out = sys.stdout if key.data == "stdout" else sys.stderr
                        out.write(text)
                        out.flush()
            code = process.wait()
        except BaseException:
            _stop(process)
            raise
    return code, tail.decode(errors="replace")


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


__all__ = ["MagicError", "PodmanHPCMagics", "stream"]
