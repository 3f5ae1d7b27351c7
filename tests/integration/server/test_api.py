"""The REST API on a real jupyter_server with the real stack behind it."""

import asyncio
import logging
import os
import uuid

from tests.helpers.commands import run
from tests.helpers.server_extension import events, finished


async def test_every_endpoint_needs_authentication(jp_fetch, server_hpc):
    for method, path in (
        ("GET", "images"),
        ("POST", "images/pull"),
        ("GET", "jobs"),
        ("POST", "jobs"),
        ("GET", "kernels"),
        ("GET", "config"),
        ("GET", "tasks"),
    ):
        response = await jp_fetch(
            "podman-hpc",
            "api",
            *path.split("/"),
            method=method,
            raise_error=False,
            headers={"Authorization": "token wrong"},
            body="{}" if method == "POST" else None,
        )
        assert response.code in (401, 403), (method, path, response.code)


async def test_config_gives_the_ui_defaults_limits_modules_and_partitions(api, server_hpc):
    status, config = await api("GET", "config")
    assert status == 200
    assert config["limits"]["max_nodes"] == 4
    assert config["defaults"]["partition"] == "debug" and config["defaults"]["mode"] == "podman-exec"
    assert {"openmpi-pmix", "gpu", "jupyter"} <= {m["name"] for m in config["modules"]}
    assert [p["name"] for p in config["partitions"]] == ["debug"]


async def test_images_lists_the_squashed_store(api, server_hpc, stack):
    status, body = await api("GET", "images")
    assert status == 200
    (tiny,) = [i for i in body["images"] if stack.tiny_image in i["names"]]
    assert tiny["squashed"] is True and tiny["local"] is False and tiny["size"] > 0


async def test_the_server_log_shows_each_podman_command_at_debug_level(api, server_hpc, jp_serverapp):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    jp_serverapp.log.addHandler(handler)
    level = jp_serverapp.log.level
    jp_serverapp.log.setLevel(logging.DEBUG)
    try:
        status, _ = await api("GET", "images")
    finally:
        jp_serverapp.log.removeHandler(handler)
        jp_serverapp.log.setLevel(level)
    assert status == 200
    lines = [r.getMessage() for r in records if r.name == "jupyter_podman_hpc"]
    assert any(" images --format json: exit 0 after " in line and "--root " in line for line in lines), lines


async def test_pull_streams_progress_and_squashes(api, server_hpc, stack):
    reference = f"{stack.registry}/tests/server-pull:{uuid.uuid4().hex[:8]}"
    context = server_hpc.work / "ctx"
    context.mkdir()
    (context / "Containerfile").write_text(f"FROM {stack.tiny_image}\nRUN head -c 3000000 /dev/urandom > /blob\n")
    run(["podman", "build", "--network", "host", "-t", reference, context])
    run(["podman", "push", reference])
    try:
        # with the transport a user may copy from elsewhere: the image is still named `reference`
        status, task = await api("POST", "images/pull", body={"image": f"docker://{reference}"})
        assert status == 202 and task["state"] in ("queued", "running")
        done = await finished(api, task)
        assert done["state"] == "succeeded", done
        status, stream = await api("GET", "tasks", task["id"], "events")
        kinds = events(stream)
        pulls = [data for kind, data in kinds if kind == "progress" and data["stage"] == "pull"]
        assert any(p["current"] and p["total"] for p in pulls), "no byte progress was streamed"
        assert any(kind == "progress" and data["stage"] == "squash" for kind, data in kinds)
        assert kinds[-1] == ("state", {"state": "succeeded", "result": done["result"], "error": None})
        _, body = await api("GET", "images")
        assert any(reference in i["names"] and i["squashed"] for i in body["images"])
        status, removed = await api("DELETE", "images", "squashed", reference)
        assert status == 200 and removed["deleted"] is True
    finally:
        run(["skopeo", "delete", "--tls-verify=false", f"docker://{reference}"], check=False)
        run(["podman", "rmi", "--ignore", reference], check=False)


async def test_build_from_text_and_from_a_file_in_the_root(api, server_hpc, stack, jp_root_dir):
    status, task = await api(
        "POST",
        "images/build",
        body={
            "containerfile": f"FROM {stack.tiny_image}\nARG WORD\nRUN echo $WORD > /word\n",
            "tag": "localhost/tests/server-build:1",
            "build_args": {"WORD": "hello"},
            "squash": True,
        },
    )
    assert status == 202
    done = await finished(api, task)
    assert done["state"] == "succeeded", done
    assert "STEP 3/3: RUN echo $WORD > /word" in done["log"]
    assert server_hpc("run", "--rm", "localhost/tests/server-build:1", "cat", "/word").stdout.strip() == "hello"

    (jp_root_dir / "proj").mkdir()
    (jp_root_dir / "proj" / "data.txt").write_text("from the context\n")
    (jp_root_dir / "proj" / "Containerfile").write_text(f"FROM {stack.tiny_image}\nCOPY data.txt /data.txt\n")
    status, task = await api(
        "POST", "images/build", body={"path": "proj/Containerfile", "tag": "localhost/tests/server-build:2"}
    )
    assert status == 202
    assert (await finished(api, task))["state"] == "succeeded"


async def test_a_failed_build_reports_its_step(api, server_hpc, stack):
    _status, task = await api(
        "POST",
        "images/build",
        body={
            "containerfile": f"FROM {stack.tiny_image}\nRUN echo about to fail && false\n",
            "tag": "localhost/tests/server-fail:1",
        },
    )
    done = await finished(api, task)
    assert done["state"] == "failed" and "RUN echo about to fail && false" in done["error"]


async def test_a_running_build_can_be_cancelled(api, server_hpc, stack):
    status, task = await api(
        "POST",
        "images/build",
        body={"containerfile": f"FROM {stack.tiny_image}\nRUN sleep 120\n", "tag": "localhost/tests/server-cancel:1"},
    )
    for _ in range(60):
        _, body = await api("GET", "tasks", task["id"])
        if any("STEP 2/2" in line for line in body["log"]) or (body["progress"] or {}).get("current") == 2:
            break
        await asyncio.sleep(0.5)
    status, _ = await api("DELETE", "tasks", task["id"])
    assert status == 202
    done = await finished(api, task, timeout=30)
    assert done["state"] == "cancelled"


async def test_bad_input_is_refused_with_a_message_and_starts_nothing(api, server_hpc, job_root):
    """One bad request through the live server: a 400 with its sentence, and no task or job.
    Every other refusal is a unit test of server/validation.py (tests/unit/server/test_validation.py)."""
    status, answer = await api("POST", "images", "pull", body={"image": "ok:tag\nrm -rf /"})
    assert status == 400 and "invalid image reference" in answer["message"], answer
    _, tasks = await api("GET", "tasks")
    assert tasks["tasks"] == []  # nothing was started
    assert list(job_root.iterdir()) == []


async def test_jobs_preview_submit_status_logs_and_cancel(api, server_hpc, stack, job_root):
    env = {
        k: server_hpc.env[k]
        for k in ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")
    }
    spec = {
        "image": stack.tiny_image,
        "command": ["sh", "-c", "echo rank $SLURM_PROCID"],
        "nodes": 2,
        "tasks_per_node": 2,
        "time": "00:05:00",
        "environment": env,
    }
    status, preview = await api("POST", "jobs", body=spec, params={"preview": "1"})
    assert status == 200 and "podman-hpc shared-run" in preview["script"] and "srun" in preview["script"]
    assert list(job_root.iterdir()) == []  # a preview writes nothing
    status, job = await api("POST", "jobs", body=spec)
    assert status == 201, job
    for _ in range(240):
        status, current = await api("GET", "jobs", job["id"])
        if current["status"]["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            break
        await asyncio.sleep(0.5)
    assert current["status"]["state"] == "COMPLETED", current
    status, logs = await api("GET", "jobs", job["id"], "logs")
    assert sorted(logs["ranks"].values()) == [f"rank {i}\n" for i in range(4)]
    _, listed = await api("GET", "jobs")
    assert job["id"] in [j["id"] for j in listed["jobs"]]

    long = {**spec, "command": ["sleep", "300"]}
    status, job = await api("POST", "jobs", body=long)
    status, _cancelled = await api("DELETE", "jobs", job["id"])
    assert status == 200
    for _ in range(120):
        _, current = await api("GET", "jobs", job["id"])
        if current["status"]["state"] == "CANCELLED":
            break
        await asyncio.sleep(0.5)
    assert current["status"]["state"] == "CANCELLED"
    status, _missing = await api("GET", "jobs", "999999")
    assert status == 404


async def test_a_notebook_job_gives_its_output_notebook_with_the_parameters(
    api, server_hpc, squashed_base, stack, job_root, jp_root_dir, monkeypatch
):
    import nbformat

    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("size = 1", metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell("print('size', size)"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(notebook, str(jp_root_dir / "Sized.ipynb"))
    keys = ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")
    env = {k: squashed_base.env[k] for k in keys}  # the server's store from now on: the one with the base image
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    spec = {"image": stack.base_image, "notebook": "Sized.ipynb", "time": "00:05:00", "environment": env}
    status, answer = await api("POST", "jobs", body={**spec, "parameters": {"size": "big"}})
    assert status == 400 and answer["message"].startswith("parameters: size=big is not a Python literal"), answer
    status, answer = await api("POST", "jobs", body={**spec, "parameters": ["size=2"]})
    assert status == 400 and answer["message"] == "'parameters' must be an object of strings", answer
    assert list(job_root.iterdir()) == []
    status, job = await api("POST", "jobs", body={**spec, "parameters": {"size": "[2, 3]"}})
    assert status == 201, job
    assert job["output"]["name"] == "Sized.out.ipynb" and job["run"]["parameters"] == {"size": "[2, 3]"}
    for _ in range(480):
        _, current = await api("GET", "jobs", job["id"])
        if current["status"]["finished"]:
            break
        await asyncio.sleep(0.5)
    assert current["status"]["state"] == "COMPLETED", current
    assert current["output"]["exists"] and current["output"]["progress"]["state"] == "completed"
    status, output = await api("GET", "jobs", job["id"], "output")
    assert status == 200 and output["name"] == "Sized.out.ipynb"
    cells = nbformat.from_dict(output["content"]).cells
    nbformat.validate(nbformat.from_dict(output["content"]))
    assert "".join(cells[1].source).endswith("size = [2, 3]") and cells[2].outputs[0]["text"] == "size [2, 3]\n"
    _, listed = await api("GET", "jobs")
    assert next(j for j in listed["jobs"] if j["id"] == job["id"])["output"]["exists"]
    command_job = {"image": stack.base_image, "command": ["true"], "environment": env}
    status, other = await api("POST", "jobs", body=command_job)
    status, answer = await api("GET", "jobs", other["id"], "output")
    assert status == 404 and "did not run a notebook" in answer["message"]


async def test_unsquashed_images_are_refused_for_jobs(api, server_hpc):
    status, answer = await api("POST", "jobs", body={"image": "localhost/never/squashed:1", "command": ["true"]})
    assert status == 404 and "not in the squashed store" in answer["message"]


async def test_kernels_install_list_remove(api, server_hpc, stack):
    status, kernel = await api(
        "POST",
        "kernels",
        body={"image": stack.base_image, "display_name": "Base (test)", "modules": ["home"], "name": "test-base"},
    )
    assert status == 201 and kernel["name"] == "test-base"
    _, listed = await api("GET", "kernels")
    assert [k["name"] for k in listed["kernels"]] == ["test-base"]
    status, _ = await api("DELETE", "kernels", "test-base")
    assert status == 200
    status, _answer = await api("DELETE", "kernels", "test-base")
    assert status == 404


async def test_jobs_are_found_again_by_a_new_server(api, server_hpc, stack, jp_serverapp):
    from jupyter_podman_hpc.server.backend import Backend

    env = {
        k: server_hpc.env[k]
        for k in ("SQUASH_DIR", "PODMANHPC_GRAPH_ROOT", "PODMANHPC_RUN_ROOT", "PODMANHPC_CONFIG_HOME")
    }
    status, job = await api("POST", "jobs", body={"image": stack.tiny_image, "command": ["true"], "environment": env})
    assert status == 201
    fresh = Backend(jp_serverapp.web_app.settings["podman_hpc_backend"].settings, jp_serverapp.root_dir)
    assert job["id"] in [j["id"] for j in fresh.jobs()]
    assert os.path.isdir(job["directory"])
