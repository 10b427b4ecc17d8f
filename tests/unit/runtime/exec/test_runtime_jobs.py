"""The pieces of a job that need no daemon: argv, the pid announcement, capped output.

The supervisor script also runs here, on the host's /bin/sh, under a plain
shell standing in for tini (no subreaper: only what does not need one is
checked). The killer and the subreaper are tested against a real container in
tests/integration/runtime.
"""

from __future__ import annotations

import subprocess

import pytest

from app.runtime.exec.process_tree import (
    INIT,
    JOB_ID,
    KILLER,
    SUPERVISOR,
    Announcement,
    CappedBuffer,
    ExecTable,
    job_argv,
    killer_argv,
)


def test_the_command_runs_under_tini_as_a_subreaper_then_the_supervisor() -> None:
    argv = job_argv("echo hi")
    assert argv[:3] == [INIT, "-s", "--"]
    assert argv[3:5] == ["/bin/sh", "-c"]
    assert argv[5] == SUPERVISOR
    assert argv[-1] == "echo hi", "the command is one argv item, never spliced into a script"


def test_the_killer_gets_both_pids() -> None:
    assert killer_argv(7, 9) == ["/bin/sh", "-c", KILLER, "sandbox-mcp-kill", "7", "9"]


@pytest.mark.parametrize("job_id", ["j", "job-1", "01J0ABC.def:2_x", "a" * 128])
def test_reasonable_job_ids_are_accepted(job_id: str) -> None:
    assert JOB_ID.fullmatch(job_id)


@pytest.mark.parametrize("job_id", ["", "-x", "a b", "a\nb", "a;b", "a" * 129, "é"])
def test_odd_job_ids_are_refused(job_id: str) -> None:
    assert not JOB_ID.fullmatch(job_id)


def test_the_announcement_is_split_off_the_output() -> None:
    announcement = Announcement()
    assert announcement.feed(b"12 3") == b""
    assert announcement.feed(b"4\nhello") == b"hello"
    assert announcement.pids == (12, 34)
    assert announcement.feed(b" world") == b" world"
    assert announcement.flush() == b""


def test_output_without_an_announcement_is_kept_whole() -> None:
    announcement = Announcement()
    assert announcement.feed(b"OCI runtime exec failed\n") == b"OCI runtime exec failed\n"
    assert announcement.pids is None


def test_a_long_first_line_is_output_not_an_announcement() -> None:
    announcement = Announcement()
    assert announcement.feed(b"1" * 20) == b""
    assert announcement.feed(b"2" * 20) == b"1" * 20 + b"2" * 20
    assert announcement.pids is None


def test_a_short_stream_without_newline_is_flushed_as_output() -> None:
    announcement = Announcement()
    assert announcement.feed(b"12") == b""
    assert announcement.flush() == b"12"


def test_capped_buffer_keeps_the_head_and_the_tail_and_counts_the_rest() -> None:
    buffer = CappedBuffer(8)  # 2 bytes of head, 6 of tail
    buffer.add(b"abc")
    buffer.add(b"defgh")
    buffer.add(b"ijklmn")
    assert buffer.text() == "ab\n[... 6 bytes left out ...]\nijklmn"
    assert (buffer.truncated, buffer.omitted) == (True, 6)


def test_capped_buffer_under_its_cap_keeps_everything() -> None:
    buffer = CappedBuffer(100)
    for part in (b"one ", b"two ", b"three"):
        buffer.add(part)
    assert (buffer.text(), buffer.truncated) == ("one two three", False)


def test_capped_buffer_trims_inside_a_chunk_and_across_many() -> None:
    buffer = CappedBuffer(40)  # 10 + 30
    for n in range(1000):
        buffer.add(f"{n:04d}\n".encode())
    head, _, tail = buffer.text().partition("\n[... ")
    assert head == "0000\n0001\n"
    assert tail.endswith("0998\n0999\n")
    assert buffer.omitted == 5000 - 40


def test_capped_buffer_decodes_broken_utf8_with_replacement() -> None:
    buffer = CappedBuffer(4)  # 1 byte of head: the cut falls inside the e acute
    buffer.add("é".encode())
    assert buffer.text() == "\ufffd\ufffd"
    assert not buffer.truncated


def test_a_zero_cap_keeps_nothing_but_says_so() -> None:
    buffer = CappedBuffer(0)
    buffer.add(b"x")
    assert (buffer.text(), buffer.truncated) == ("\n[... 1 bytes left out ...]\n", True)


def test_a_job_id_runs_once_per_container() -> None:
    table = ExecTable()
    job = table.add("c1", "j1")
    assert job is not None
    assert table.add("c1", "j1") is None
    assert table.add("c2", "j1") is not None
    assert table.get("c1", "j1") is job
    table.discard(job)
    assert table.get("c1", "j1") is None
    assert len(table) == 1


def _supervise(command: str) -> subprocess.CompletedProcess[str]:
    # W kills the other children of its parent (T in a container): give it a
    # parent of its own here, a shell with no other child.
    return subprocess.run(
        ["/bin/sh", "-c", '"$@"; exit $?', "t", "/bin/sh", "-c", SUPERVISOR, "w", command],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_supervisor_announces_runs_and_keeps_the_exit_status() -> None:
    done = _supervise("echo out; echo err >&2; exit 7")
    first, rest = done.stdout.split("\n", 1)
    ppid, pid = (int(x) for x in first.split())
    assert ppid > 0
    assert pid > 0
    assert rest == "out\n"
    assert done.stderr == "err\n"
    assert done.returncode == 7


def test_the_command_gets_the_callers_path_back() -> None:
    done = _supervise("echo $PATH")
    assert (
        done.stdout.splitlines()[1]
        == subprocess.run(
            ["/bin/sh", "-c", "echo $PATH"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
