"""The framed stdout records inside a worker's stderr file (launchers/relay.py), split back in order however
the file's bytes arrive: a record or a mark cut between two reads, and a mark-like text that is no record."""

from __future__ import annotations

from overdrive.launchers.relay import MARK, split, stderr_text


def record(text: bytes) -> bytes:
    return MARK + str(len(text)).encode() + b":" + text


def test_pieces_come_back_in_the_order_written_whatever_the_cuts():
    stream = b"progress 1\n" + record(b"result 1\n") + b"progress 2\n" + record(b"a:b " + MARK[:4]) + b"tail"
    want = [(False, b"progress 1\n"), (True, b"result 1\n"), (False, b"progress 2\n"), (True, b"a:b " + MARK[:4]),
            (False, b"tail")]
    for cut in range(len(stream) + 1):
        got, left = split(stream[:cut])
        more, left = split(left + stream[cut:])
        assert left == b""
        joined: list[tuple[bool, bytes]] = []
        for is_stdout, data in got + more:  # a stderr run may arrive in two pieces
            if joined and joined[-1][0] is is_stdout is False:
                joined[-1] = (False, joined[-1][1] + data)
            else:
                joined.append((is_stdout, data))
        assert joined == want, cut


def test_a_mark_without_a_length_is_stderr_text_and_reports_leave_stdout_out():
    odd = MARK + b"not a record\n"
    assert split(odd) == ([(False, MARK), (False, b"not a record\n")], b"")
    assert stderr_text(b"Traceback\n" + record(b"printed\n") + b"ValueError: x\n") == "Traceback\nValueError: x\n"
