"""Listening ports come from below the ephemeral range, free when picked, never twice from one process."""

import socket

from common.ports import ephemeral_range, is_free, listen_ports


def test_listen_ports_are_distinct_free_and_below_the_ephemeral_range():
    low, _ = ephemeral_range()
    first, second = listen_ports(20), listen_ports(20)
    assert len(set(first + second)) == 40  # never handed out twice in a process
    assert all(port < low for port in first + second)
    assert all(is_free(port) for port in first + second)


def test_a_port_something_listens_on_is_not_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not is_free(s.getsockname()[1])


def test_an_unreadable_range_falls_back_to_linuxs_default(tmp_path):
    assert ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    (tmp_path / "range").write_text("40000\t50000\n")
    assert ephemeral_range(str(tmp_path / "range")) == (40000, 50000)
