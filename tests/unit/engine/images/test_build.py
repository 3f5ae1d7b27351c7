"""Build-log parsing, the build context tar and the build's input checks (no podman needed)."""

import socket
import tarfile

import pytest

from jupyter_podman_hpc.engine.errors import EngineError, InvalidReference
from jupyter_podman_hpc.engine.images.build import TAIL_LINES, BuildLog, _context_tar, build, parse_step
from jupyter_podman_hpc.engine.site.config import load_config


def test_parse_step_reads_number_total_and_instruction():
    step = parse_step("STEP 3/7: RUN make -j4 && make install")
    assert (step.number, step.total, step.instruction) == (3, 7, "RUN make -j4 && make install")
    assert step.line == "STEP 3/7: RUN make -j4 && make install" and step.stage is None


def test_parse_step_knows_multi_stage_prefixes():
    step = parse_step("[1/2] STEP 1/3: FROM busybox AS builder")
    assert (step.stage, step.stages, step.number, step.total) == (1, 2, 1, 3)
    assert step.instruction == "FROM busybox AS builder"


@pytest.mark.parametrize(
    "line",
    [
        "--> 0a1b2c3d4e5",
        "RUN echo STEP 1/2: no",
        "STEP x/y: RUN",
        "COMMIT img",
        "",
        "Successfully tagged localhost/x:1",
    ],
)
def test_other_lines_are_not_steps(line):
    assert parse_step(line) is None


def feed_all(log, chunks):
    for chunk in chunks:
        log.feed(chunk)
    log.flush()


def test_build_log_splits_chunks_into_lines_and_attributes_them_to_steps():
    events = []
    log = BuildLog(events.append)
    feed_all(
        log,
        [
            "STEP 1/2: FROM tiny\nSTEP 2/2: RUN ec",
            "ho hi\n",
            "hi\nmore ",
            "output\n--> 0a1b2c3\n",
            "COMMIT localhost/x:1\n",
            "a" * 64 + "\n",
        ],
    )
    steps = [e for e in events if e.log.startswith("STEP ")]
    assert [(e.current, e.total, e.message) for e in steps] == [
        (1, 2, "STEP 1/2: FROM tiny"),
        (2, 2, "STEP 2/2: RUN echo hi"),
    ]
    output = [e for e in events if not e.log.startswith("STEP ")]
    assert [e.log for e in output][:2] == ["hi", "more output"]
    assert all(e.stage == "build" and e.message == "STEP 2/2: RUN echo hi" and e.current == 2 for e in output)
    assert log.image_id == "a" * 64
    assert list(log.step_output) == ["hi", "more output"]  # "-->", COMMIT and the id are not step output


def test_build_log_keeps_the_last_lines_of_the_failing_step():
    log = BuildLog()
    feed_all(log, ["STEP 1/2: FROM tiny\n", "STEP 2/2: RUN seq 30; exit 3\n"] + [f"{i}\n" for i in range(1, 31)])
    error = log.failure(
        'building at STEP "RUN seq 30; exit 3": while running runtime: exit status 3\n', "localhost/x:1"
    )
    assert isinstance(error, EngineError)
    assert error.step == "STEP 2/2: RUN seq 30; exit 3"
    assert error.reason == "while running runtime: exit status 3"
    assert (
        str(error) == "build of localhost/x:1 failed at STEP 2/2: RUN seq 30; exit 3: "
        "while running runtime: exit status 3"
    )
    lines = error.output.splitlines()
    assert len(lines) == TAIL_LINES and lines[-1] == "30" and lines[0] == "11"


def test_build_failure_without_a_step_line_names_the_instruction_from_the_error():
    error = BuildLog().failure('building at STEP "COPY missing /x": checking on sources: no such file', "localhost/x:1")
    assert error.step == "STEP: COPY missing /x" and "no such file" in str(error)
    plain = BuildLog().failure("Containerfile: no FROM", "localhost/x:1")
    assert str(plain) == "build of localhost/x:1 failed: Containerfile: no FROM" and plain.step == ""


def members(body):
    with tarfile.open(fileobj=body) as tar:
        return {m.name: (tar.extractfile(m).read().decode() if m.isfile() else m) for m in tar.getmembers()}


def test_context_tar_without_a_context_holds_only_the_containerfile_and_its_ignore_file():
    with _context_tar(None, "FROM x\n", ".cf") as body:
        found = members(body)
    assert found == {".cf": "FROM x\n", ".containerignore": ".cf\n.containerignore\n"}


def test_context_tar_extends_the_contexts_ignore_file(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / ".dockerignore").write_text("*.log\n")
    (tmp_path / "link").symlink_to("src/a.py")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tmp_path / "sock"))  # sockets are not sent
    try:
        with _context_tar(tmp_path, "FROM x\n", ".cf") as body:
            found = members(body)
            body.seek(0)
            with tarfile.open(fileobj=body) as tar:
                owners = {(m.uid, m.gid) for m in tar.getmembers()}
    finally:
        listener.close()
    assert found[".dockerignore"] == "*.log\n.cf\n" and ".containerignore" not in found
    assert found["src/a.py"] == "print(1)\n" and found["link"].issym() and "sock" not in found
    assert owners == {(0, 0)}


def test_build_rejects_bad_input_before_starting_podman(tmp_path):
    config = load_config({"PODMANHPC_RUN_ROOT": str(tmp_path / "run")})
    with pytest.raises(InvalidReference):
        build(config, "FROM x\n", "Not A Tag")
    with pytest.raises(EngineError, match="is not a directory"):
        build(config, "FROM x\n", "localhost/x:1", context_dir=tmp_path / "missing")
    with pytest.raises(EngineError, match="Containerfile is empty"):
        build(config, "  \n", "localhost/x:1")
    assert not (tmp_path / "run").exists()
