"""A local OCI registry (Debian's docker-registry) on 127.0.0.1 only."""

import urllib.error
import urllib.request

from . import layout
from .proc import running_pid, say, start_daemon, stop_daemon, write_if_changed

CONFIG = layout.REGISTRY_DIR / "config.yml"


def answers(path: str = "/v2/", method: str = "GET") -> bool:
    request = urllib.request.Request(f"http://{layout.REGISTRY}{path}", method=method)
    request.add_header(
        "Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def up() -> None:
    if running_pid("registry") and answers():
        return
    stop_daemon("registry")
    data = layout.REGISTRY_DIR / "data"
    data.mkdir(parents=True, exist_ok=True)
    # Debian's default config points at a missing htpasswd and listens everywhere.
    write_if_changed(
        CONFIG,
        f"""\
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: {data}
  delete:
    enabled: true
http:
  addr: {layout.REGISTRY}
""",
    )
    say(f"starting the registry on {layout.REGISTRY}")
    start_daemon("registry", ["docker-registry", "serve", str(CONFIG)], ready=answers)


def down() -> None:
    stop_daemon("registry")


def status() -> dict[str, bool]:
    return {"registry": running_pid("registry") is not None and answers()}
