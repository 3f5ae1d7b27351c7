"""The per-user Podman REST service, and the records of the server's background tasks.

- ``rest``: the per-user Podman REST service and clients of it
- ``stream``: that service's streamed events, its errors, and cancelling what it streams
- ``sweep``: private services of callers that died (a server SIGKILLed mid-build) stopped, with what they left
- ``taskrecords``: each background task's state on disk, so the next server lists one cut short as interrupted
"""
