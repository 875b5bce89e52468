"""benchmarks.syscalls: strace's summary read back, and per-request counts."""

from __future__ import annotations

import shutil

import pytest

from benchmarks.syscalls import Count, main, parse_summary, rows

# strace -c -f's summary as strace 6 writes it: the errors column is empty where none failed.
SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 85.56    0.972426         551      1763       474 futex
  5.68    0.064524           6      9708           write
  2.27    0.025842           2      9724           read
  2.03    0.023055           6      3838           epoll_pwait
  0.00    0.000008           0        16           epoll_ctl
------ ----------- ----------- --------- --------- ----------------
100.00    1.136520          22     25049       474 total
"""


def test_the_summary_is_read_call_by_call_without_its_total() -> None:
    calls = parse_summary(SUMMARY)
    assert calls == {
        "futex": 1763,
        "write": 9708,
        "read": 9724,
        "epoll_pwait": 3838,
        "epoll_ctl": 16,
    }
    assert parse_summary("strace: Process 12 attached\n") == {}


def test_counts_per_request_and_the_row_of_the_rest() -> None:
    c = Count("http", "sidecar", 4000, parse_summary(SUMMARY), 4.0)
    assert c.per_request() == pytest.approx(25049 / 4000)
    assert c.per_request("write") == pytest.approx(9708 / 4000)
    assert c.per_request("getpid") == 0.0
    (row,) = rows([c])
    assert row[:4] == ("http", "sidecar", 4000, f"{25049 / 4000:.2f}")
    assert row[-1] == f"{16 / 4000:.2f}"  # epoll_ctl: not a column of its own
    assert Count("grpc", "floor", 0, {"read": 3}, 1.0).per_request() == 3.0  # none answered


def test_bad_protocols_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("strace") is None:
        assert main(["--protocols", "http"]) == 2  # said before anything starts
        assert "needs strace" in capsys.readouterr().err
        return
    with pytest.raises(SystemExit):
        main(["--protocols", "quic"])
    assert "--protocols takes http and grpc" in capsys.readouterr().err
