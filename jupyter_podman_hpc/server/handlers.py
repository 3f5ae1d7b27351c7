"""REST handlers under ``<base_url>/podman-hpc/api/``: parse and check, call the backend, write JSON.

Every handler is authenticated and authorized (resource ``podman-hpc``);
writes from a browser need the XSRF token, as every Jupyter API. Engine
errors become 4xx answers ``{"message": ...}``; nothing is started on bad input.
"""

from __future__ import annotations

import json
from functools import wraps
from urllib.parse import unquote

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from ..engine.errors import Conflict, EngineError, InvalidInput, NotFound, PermissionDenied, ToolFailed
from ..engine.text import truth
from ..kernels.kernelspec import MAX_POOL
from . import validation as v
from .backend import Backend
from .tasks import FINISHED

RESOURCE = "podman-hpc"


# The one table from the engine's kinds of error to HTTP status (502: the server is a
# gateway to podman, and podman failed).
HTTP_STATUS = ((NotFound, 404), (PermissionDenied, 403), (Conflict, 409), (InvalidInput, 400), (ToolFailed, 502))


def http_status(err: EngineError, default: int = 400) -> int:
    """The status of an engine error's kind (``default`` for any other EngineError)."""
    return next((status for kind, status in HTTP_STATUS if isinstance(err, kind)), default)


def http_error(err: EngineError, default: int = 400) -> web.HTTPError:
    """The HTTPError a handler raises for an engine error: its status and its first line."""
    message = str(err).splitlines()[0] if str(err) else type(err).__name__
    return web.HTTPError(http_status(err, default), reason=message)


class KernelStartFailed(web.HTTPError):
    """An engine error of a kernel start, for jupyter_server's own kernel and session
    handlers: they show the user an HTTPError's ``log_message`` (any other exception
    becomes "Unhandled error"), and ``str()`` of it when starting a session."""

    def __init__(self, err: EngineError):
        super().__init__(http_status(err, default=500), str(err), reason="Kernel failed to start")

    def __str__(self) -> str:
        return self.get_message() or ""


def engine_errors(method):
    """EngineError -> its HTTP status (``http_status``), with its message."""

    @wraps(method)
    async def wrapper(self, *args, **kwargs):
        try:
            return await method(self, *args, **kwargs)
        except EngineError as err:
            raise http_error(err) from err

    return wrapper


class Base(APIHandler):
    auth_resource = RESOURCE

    @property
    def backend(self) -> Backend:
        """The server's Backend, set up by the extension at load time."""
        return self.settings["podman_hpc_backend"]

    async def blocking(self, fn, *args):
        """Engine calls run podman or Slurm: keep them off the server's event loop."""
        from tornado.ioloop import IOLoop

        return await IOLoop.current().run_in_executor(None, fn, *args)

    def reply(self, data, status: int = 200) -> None:
        """Finish the request with ``data`` as JSON and HTTP status ``status``."""
        self.set_status(status)
        self.finish(json.dumps(data))

    def write_error(self, status_code: int, **kwargs) -> None:
        """An error's reply: ``{"message": ...}``, one sentence for the user, never a traceback."""
        self.set_header("Content-Type", "application/json")
        reason = self._reason
        exc_info = kwargs.get("exc_info")
        if exc_info and isinstance(exc_info[1], web.HTTPError) and exc_info[1].reason:
            reason = exc_info[1].reason
        self.finish(json.dumps({"message": reason}))


class ImagesHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self):
        """``GET images``: ``{"images": [...]}``, the user's local and squashed images."""
        self.reply({"images": await self.blocking(self.backend.images)})


class PullHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def post(self):
        """``POST images/pull`` ``{"image", "squash"}``: start a pull (squashed unless ``squash`` is false);
        202 with the task."""
        body = v.json_body(self.request)
        task = self.backend.pull(v.image(body), v.boolean(body, "squash", True))
        self.reply(task.as_dict(), 202)


class BuildHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def post(self):
        """``POST images/build``: start a build of a Containerfile given as text (``containerfile``) or as a
        file in the server's root (``path``), tagged ``tag``, with its ``context`` and ``build_args``;
        202 with the task."""
        limit = self.backend.settings.max_containerfile_bytes
        body = v.json_body(self.request, limit=limit + 64_000)
        tag = v.image(body, "tag")
        text = body.get("containerfile")
        path = v.string(body, "path", required=False)
        if (text is None) == (not path):
            raise v.BadRequest("give either 'containerfile' (its text) or 'path' (a file in the server's root)")
        if path:
            file = v.inside_root(self.backend.root_dir, path, "path")
            if not file.is_file():
                raise v.BadRequest(f"'path': {path} is not a file", 404)
            if file.stat().st_size > limit:
                raise v.BadRequest(f"the Containerfile is larger than {limit} bytes", 413)
            text = file.read_text(errors="replace")
        else:
            text = v.string(body, "containerfile", max_length=limit)
        context_path = v.string(body, "context", required=False)
        context = None
        if context_path:
            context = v.inside_root(self.backend.root_dir, context_path, "context")
            if not context.is_dir():
                raise v.BadRequest(f"'context': {context_path} is not a directory", 404)
        elif path:
            context = file.parent  # as `podman build -f dir/Containerfile dir`
        build_args = v.string_map(body, "build_args")
        task = self.backend.build(text, tag, build_args, context, v.boolean(body, "squash", False))
        self.reply(task.as_dict(), 202)


class SquashHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def post(self):
        """``POST images/squash`` ``{"image"}``: start squashing a local image into the user's store; 202
        with the task."""
        body = v.json_body(self.request)
        self.reply(self.backend.squash(v.image(body)).as_dict(), 202)


class SquashedImageHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def delete(self, image):
        """``DELETE images/squashed/IMAGE``: remove the image (or that name of it) from the squashed store;
        what was removed."""
        image = v.image({"image": unquote(image)})
        self.reply(await self.blocking(self.backend.remove_squashed, image))


class TasksHandler(Base):
    @web.authenticated
    @authorized
    async def get(self):
        """``GET tasks``: ``{"tasks": [...]}``, the server's tasks, newest first."""
        self.reply({"tasks": [task.as_dict() for task in self.backend.tasks.list()]})


class TaskHandler(Base):
    def _task(self, task_id):
        task = self.backend.tasks.get(task_id)
        if task is None:
            raise web.HTTPError(404, reason=f"no task {task_id}")
        return task

    @web.authenticated
    @authorized
    async def get(self, task_id):
        """``GET tasks/ID``: the task with the last 200 lines of its log; 404 if there is none."""
        self.reply(self._task(task_id).as_dict(log_lines=200))

    @web.authenticated
    @authorized
    async def delete(self, task_id):
        """``DELETE tasks/ID``: ask the task to stop (at once if it has not started); 202 with the task."""
        task = self._task(task_id)
        self.backend.tasks.cancel(task)
        self.reply(task.as_dict(), 202)


class TaskEventsHandler(Base):
    """Server-sent events: every event of the task from the start (or from Last-Event-ID)."""

    @web.authenticated
    @authorized
    async def get(self, task_id):
        """``GET tasks/ID/events``: the task's events as a server-sent event stream, from after
        ``Last-Event-ID`` (or ``?after=``) until the task has finished."""
        task = self.backend.tasks.get(task_id)
        if task is None:
            raise web.HTTPError(404, reason=f"no task {task_id}")
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        last = self._last_event_id()
        try:
            await self._stream(task, last)
        except StreamClosedError:
            return
        self.finish()

    def _last_event_id(self) -> int:
        """The id of the last event the client has (``Last-Event-ID``, else ``?after=``, else -1); 400 if
        it is not a number."""
        last = self.request.headers.get("Last-Event-ID") or self.get_argument("after", "-1")
        try:
            return int(last)
        except ValueError:
            raise web.HTTPError(400, reason="Last-Event-ID must be a number")

    async def _stream(self, task, last: int) -> None:
        """Send the task's events after ``last`` as they come, until the task has finished and every
        event of it has been sent."""
        while True:
            last = await self._send_events_after(task, last)
            if task.state in FINISHED and not any(e.id > last for e in task.events):
                return

    async def _send_events_after(self, task, last: int) -> int:
        """Send (and flush) the task's next events after ``last``, once there are some or the task has
        finished; the id of the last event sent."""
        for event in await self.backend.tasks.events_after(task, last):
            self.write(f"id: {event.id}\nevent: {event.kind}\ndata: {json.dumps(event.data)}\n\n")
            last = event.id
        await self.flush()
        return last


class JobsHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self):
        """``GET jobs``: ``{"jobs": [...], "problems": [...]}``, the jobs under the job root, newest first,
        and the records that could not be read."""
        problems: list[str] = []  # unreadable job records: the others are listed all the same
        jobs = await self.blocking(self.backend.jobs, problems)
        self.reply({"jobs": jobs, "problems": problems})

    @web.authenticated
    @authorized
    @engine_errors
    async def post(self):
        """``POST jobs``: submit the job spec in the body, within the server's limits; 201 with the job, or
        with ``?preview=1`` only its batch script."""
        body = v.json_body(self.request)
        spec = self._checked_spec(body)
        if truth(self.get_argument("preview", "0")):
            self.reply({"script": await self.blocking(self.backend.preview, spec)})
        else:
            self.reply(await self.blocking(self.backend.submit, spec), 201)

    def _checked_spec(self, body: dict) -> dict:
        """The limits the server sets, and notebook/script paths resolved inside its root."""
        limits = self.backend.settings
        spec = dict(body)
        for key, high in (("nodes", limits.max_nodes), ("tasks_per_node", limits.max_tasks_per_node)):
            if key in spec:
                v.integer(spec, key, low=1, high=high)
        for key in ("notebook", "python_script"):
            if spec.get(key) is not None:
                spec[key] = self._file_inside_root(spec, key)
        for key in ("command", "args", "modules", "extra_directives"):
            if spec.get(key) is not None:
                v.string_list(spec, key)
        # parameters: names and Python literals, which JobSpec checks (a 400 naming the bad one)
        for key in ("environment", "parameters"):
            if key in spec:
                v.string_map(spec, key)
        return spec

    def _file_inside_root(self, spec: dict, key: str) -> str:
        """``spec[key]`` resolved inside the server's root; 404 if it is not a file there."""
        path = v.inside_root(self.backend.root_dir, v.string(spec, key), key)
        if not path.is_file():
            raise v.BadRequest(f"'{key}': {spec[key]} is not a file", 404)
        return str(path)


class JobHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self, job_id):
        """``GET jobs/ID``: the job with its Slurm status."""
        self.reply(await self.blocking(self.backend.job, job_id))

    @web.authenticated
    @authorized
    @engine_errors
    async def delete(self, job_id):
        """``DELETE jobs/ID``: cancel the job; the job after."""
        self.reply(await self.blocking(self.backend.cancel, job_id))


class JobLogsHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self, job_id):
        """``GET jobs/ID/logs``: each rank's stdout and stderr so far, and the batch log."""
        self.reply(await self.blocking(self.backend.logs, job_id))


class JobOutputHandler(Base):
    """A notebook job's executed notebook (JSON, as rank 0 last wrote it): 404 until it exists."""

    @web.authenticated
    @authorized
    @engine_errors
    async def get(self, job_id):
        """``GET jobs/ID/output``: the job's output notebook, where it is and rank 0's progress; 404 for a
        job that ran no notebook."""
        self.reply(await self.blocking(self.backend.output, job_id))


class ClustersHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self):
        """``GET clusters``: ``{"clusters": [...]}``, the user's running clusters, orphaned ones swept
        first."""
        self.reply({"clusters": await self.blocking(self.backend.clusters)})


class ClusterHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def delete(self, cluster_id):
        """``DELETE clusters/ID``: stop the cluster; the cluster after."""
        self.reply(await self.blocking(self.backend.stop_cluster, cluster_id))


class KernelsHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self):
        """``GET kernels``: ``{"kernels": [...], "problems": [...]}``, the installed container kernels and
        the kernelspecs that could not be read."""
        problems: list[str] = []  # broken kernelspecs: the others are listed all the same
        kernels = await self.blocking(self.backend.kernels, problems)
        self.reply({"kernels": kernels, "problems": problems})

    @web.authenticated
    @authorized
    @engine_errors
    async def post(self):
        """``POST kernels`` ``{"image", "display_name", "name", "modules", "pool"}``: install a container
        kernel; 201 with the kernel."""
        body = v.json_body(self.request)
        image = v.image(body)
        display_name = v.string(body, "display_name", required=False, max_length=200) or None
        name = v.string(body, "name", required=False, max_length=64) or None
        modules = v.string_list(body, "modules")
        pool = v.integer(body, "pool", low=0, high=MAX_POOL) if body.get("pool") is not None else None
        kernel = await self.blocking(self.backend.install_kernel, image, display_name, modules, name, pool)
        self.reply(kernel, 201)


class KernelHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def delete(self, name):
        """``DELETE kernels/NAME``: remove the container kernel; the kernel removed."""
        self.reply(await self.blocking(self.backend.remove_kernel, name))


class ConfigHandler(Base):
    @web.authenticated
    @authorized
    @engine_errors
    async def get(self):
        """``GET config``: what the Lab panel needs to draw its forms (``Backend.ui_config``)."""
        self.reply(await self.blocking(self.backend.ui_config))


ROUTES = [
    (r"images", ImagesHandler),
    (r"images/pull", PullHandler),
    (r"images/build", BuildHandler),
    (r"images/squash", SquashHandler),
    (r"images/squashed/(.+)", SquashedImageHandler),
    (r"tasks", TasksHandler),
    (r"tasks/([0-9a-f]+)", TaskHandler),
    (r"tasks/([0-9a-f]+)/events", TaskEventsHandler),
    (r"jobs", JobsHandler),
    (r"jobs/([^/]+)", JobHandler),
    (r"jobs/([^/]+)/logs", JobLogsHandler),
    (r"jobs/([^/]+)/output", JobOutputHandler),
    (r"clusters", ClustersHandler),
    (r"clusters/([0-9a-f]+)", ClusterHandler),
    (r"kernels", KernelsHandler),
    (r"kernels/([^/]+)", KernelHandler),
    (r"config", ConfigHandler),
]


def handlers(base_url: str) -> list[tuple[str, type]]:
    """The extension's routes under ``base_url`` (``<base_url>/podman-hpc/api/...``), each with its handler."""
    return [(url_path_join(base_url, "podman-hpc", "api", pattern) + "$", handler) for pattern, handler in ROUTES]
