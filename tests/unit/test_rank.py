"""The rank path's rendezvous: binding elects the first task, the others connect to it."""

import os
import socket
import uuid

from jupyter_podman_hpc import rank


def test_first_binds_the_others_connect_and_messages_round_trip():
    address = rank.address_of(f"unit-{uuid.uuid4().hex}.0.node")
    kind, listener = rank.rendezvous(address)
    assert kind == "listener"
    other, connection = rank.rendezvous(address)
    assert other == "connection" and rank.peer_uid(connection) == os.getuid()
    assert connection.fileno() >= 10 and listener.fileno() >= 10  # never fd 3, where PMI_FD goes
    server = socket.socket(fileno=listener._accept()[0])
    message = {"kind": "plan", "argv": ["shared-run", "img"], "env": {"A": "1" * 100000}}
    rank.send(connection, message)
    assert rank.receive(server) == message
    server.close()
    assert rank.receive(connection) is None  # the monitor went away
    listener.close()
    again, fresh = rank.rendezvous(address)  # an abstract name goes with its last holder
    assert again == "listener"
    fresh.close()


def test_outside_a_step_there_is_no_rendezvous():
    assert rank.step_address({}) is None
    assert rank.step_address({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "1", "SLURMD_NODENAME": "n2"}) == \
        rank.address_of("7.1.n2")
