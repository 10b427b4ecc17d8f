"""How one file's content changed: bounded reads through a Jail, line counts, unified diffs."""

from __future__ import annotations

import codecs
import json
import os
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from difflib import SequenceMatcher
from itertools import chain, zip_longest

from jail import Jail, JailError, PathInfo
from jail.pack import Pack

# One side of a comparison: a folder through the jail, or a baseline kept as a pack.
Side = Jail | Pack

SNIFF_BYTES = 8192
CONTEXT_LINES = 3
_CHUNK = 1024 * 1024
_GAP_CELLS = 1_000_000  # largest gap without anchors given to difflib (lines x lines)
_WORK_BUDGET = 20_000_000  # lines visited and difflib cells, per file

Opcode = tuple[str, int, int, int, int]


@dataclass(frozen=True)
class TextChange:
    insertions: int
    deletions: int
    binary: bool
    hunks: Iterator[str] | None  # the "@@" hunks, formatted lazily; None when binary
    exact: bool = True  # False: matching was cut short, so the counts run high


def compare_bytes(before: bytes, after: bytes) -> TextChange:
    """Line counts and hunks for ``before`` -> ``after`` (binary if either side is)."""
    a, b = decode_text(before), decode_text(after)
    if a is None or b is None:
        return TextChange(0, 0, True, None)
    a_lines, b_lines = split_lines(a), split_lines(b)
    ops, exact = line_opcodes(a_lines, b_lines)
    return TextChange(*count_changes(ops), False, hunks(a_lines, b_lines, ops), exact)


class ContentReader:
    """Reads regular files for comparison, within a per-file cap and a budget for the call.

    Only ``Jail`` (or ``Pack``) methods touch the files. Failures (a file vanished, or
    was swapped for a link or a FIFO since it was listed) are noted, never raised.
    """

    def __init__(
        self, read_limit: int, compare_limit: int, budget: int, note: Callable[[str], None]
    ) -> None:
        self.read_limit = read_limit
        self._compare_limit = compare_limit
        self._left = budget
        self._budget = budget
        self._note = note

    def read(self, jail: Side, info: PathInfo) -> bytes | None:
        """The content of ``info``; None if over the cap or unreadable."""
        if info.size > self.read_limit:
            return None
        if info.size > self._left:
            self._note(f"{shown_path(info.path)}: not read, {self._budget}-byte budget spent")
            return None
        try:
            data = jail.read_bytes(info.path, max_bytes=self.read_limit)
        except JailError as exc:
            self._note(f"{shown_path(info.path)}: not read ({exc.code})")
            return None
        self._left -= len(data)
        return data

    def same(self, base: Side, ws: Side, old: PathInfo, new: PathInfo) -> bool:
        """Whether two files match, streamed; False if sizes differ or past the limit."""
        if old.size != new.size or old.size > min(self._compare_limit, self._left // 2):
            return False  # assume the write that changed the mtime changed content
        try:
            with _reading(base, old.path) as fa, _reading(ws, new.path) as fb:
                for a, b in zip_longest(_blocks(fa, _CHUNK), _blocks(fb, _CHUNK)):
                    if a != b:
                        return False
                    self._left -= 2 * len(a)
                return True
        except (JailError, OSError):
            return False

    def looks_binary(self, jail: Side, info: PathInfo) -> bool:
        """Whether the first 8 KB of ``info`` look binary (False if unreadable)."""
        try:
            with _reading(jail, info.path) as pieces:
                head = next(_blocks(pieces, SNIFF_BYTES), b"")
        except (JailError, OSError):
            return False
        if b"\0" in head:
            return True
        try:
            # Incremental: a character cut at the 8 KB mark is not an error.
            codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        except UnicodeDecodeError:
            return True
        return False


@contextmanager
def _reading(side: Side, path: str) -> Iterator[Iterator[bytes]]:
    """The file's content in pieces (of any length: see ``_blocks``)."""
    if isinstance(side, Pack):
        yield side.chunks(path, _CHUNK)
        return
    # O_NOFOLLOW: a file swapped for a link since it was listed is refused, not followed.
    fd = side.open_fd(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        yield iter(lambda: os.read(fd, _CHUNK), b"")
    finally:
        os.close(fd)


def _blocks(pieces: Iterator[bytes], size: int) -> Iterator[bytes]:
    """``pieces`` regrouped in blocks of ``size`` bytes (the last may be shorter): a pack
    yields its pieces where its segments end, a file where reads stop."""
    pending = b""
    for piece in pieces:
        pending += piece
        while len(pending) >= size:
            yield pending[:size]
            pending = pending[size:]
    if pending:
        yield pending


def decode_text(data: bytes) -> str | None:
    """The text of ``data``, or None if it is binary (a NUL in the first 8 KB, or not UTF-8)."""
    if b"\0" in data[:SNIFF_BYTES]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def split_lines(text: str) -> list[str]:
    # Only "\n" ends a line, as in git and diff(1); str.splitlines would also
    # split on "\r", "\f" and U+2028 and so miscount lines.
    lines = text.split("\n")
    last = lines.pop()
    result = [line + "\n" for line in lines]
    if last:
        result.append(last)
    return result


def line_opcodes(a: list[str], b: list[str]) -> tuple[list[Opcode], bool]:
    """Opcodes turning ``a`` into ``b``; False with them if the work cap cut matching short.

    Patience diff: lines found once on each side, in the same order, anchor the
    match; gaps are split again, and a gap with no such line goes to difflib.
    difflib alone is quadratic on large files with scattered edits (a minute for
    every 10th line of 60,000). Work is capped: past the cap, a gap counts as
    entirely replaced, so a crafted file can only inflate its own line counts.
    """
    blocks: list[tuple[int, int, int]] = []
    budget, exact = _WORK_BUDGET, True
    pending = [(0, len(a), 0, len(b))]
    while pending:
        alo, ahi, blo, bhi = pending.pop()
        head = tail = 0
        while alo + head < ahi and blo + head < bhi and a[alo + head] == b[blo + head]:
            head += 1
        blocks.append((alo, blo, head))
        alo, blo = alo + head, blo + head
        while alo < ahi - tail and blo < bhi - tail and a[ahi - 1 - tail] == b[bhi - 1 - tail]:
            tail += 1
        ahi, bhi = ahi - tail, bhi - tail
        blocks.append((ahi, bhi, tail))
        cost = (ahi - alo) + (bhi - blo)
        if alo == ahi or blo == bhi:
            continue  # only insertions or only deletions left: nothing to match
        if cost > budget:
            exact = False
            continue
        budget -= cost
        anchors = _anchors(a[alo:ahi], b[blo:bhi])
        start_a, start_b = alo, blo
        for i, j in anchors:
            pending.append((start_a, alo + i, start_b, blo + j))
            blocks.append((alo + i, blo + j, 1))
            start_a, start_b = alo + i + 1, blo + j + 1
        if anchors:
            pending.append((start_a, ahi, start_b, bhi))
        elif (cells := (ahi - alo) * (bhi - blo)) <= min(_GAP_CELLS, budget):
            budget -= cells
            matcher = SequenceMatcher(None, a[alo:ahi], b[blo:bhi])
            blocks.extend((alo + i, blo + j, n) for i, j, n in matcher.get_matching_blocks())
        else:
            exact = False
    blocks = sorted(block for block in blocks if block[2])
    return _opcodes(blocks, len(a), len(b)), exact


def _anchors(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """The longest run, in order on both sides, of lines found once in ``a`` and once in ``b``."""
    in_a, in_b = Counter(a), Counter(b)
    at_b = {line: j for j, line in enumerate(b) if in_b[line] == 1 and in_a[line] == 1}
    pairs = [(i, at_b[line]) for i, line in enumerate(a) if line in at_b]
    # Longest increasing subsequence of the b positions (patience sorting).
    tops: list[int] = []  # smallest last j of a run of each length
    top_at: list[int] = []  # index in pairs of that last element
    back: list[int] = []
    for k, (_, j) in enumerate(pairs):
        n = bisect_left(tops, j)
        if n == len(tops):
            tops.append(j)
            top_at.append(k)
        else:
            tops[n], top_at[n] = j, k
        back.append(top_at[n - 1] if n else -1)
    run, k = [], top_at[-1] if top_at else -1
    while k >= 0:
        run.append(pairs[k])
        k = back[k]
    return run[::-1]


def _opcodes(blocks: list[tuple[int, int, int]], a_len: int, b_len: int) -> list[Opcode]:
    # As SequenceMatcher.get_opcodes, from matching blocks in order on both sides.
    ops: list[Opcode] = []
    i = j = 0
    for ai, bj, size in [*blocks, (a_len, b_len, 0)]:
        if i < ai or j < bj:
            tag = "replace" if i < ai and j < bj else "delete" if i < ai else "insert"
            ops.append((tag, i, ai, j, bj))
        if size and ops and ops[-1][0] == "equal" and (ops[-1][2], ops[-1][4]) == (ai, bj):
            ops[-1] = ("equal", ops[-1][1], ai + size, ops[-1][3], bj + size)
        elif size:
            ops.append(("equal", ai, ai + size, bj, bj + size))
        i, j = ai + size, bj + size
    return ops


def count_changes(ops: Iterable[Opcode]) -> tuple[int, int]:
    """(insertions, deletions): the "+" and "-" lines of the unified diff."""
    insertions = deletions = 0
    for tag, i1, i2, j1, j2 in ops:
        if tag != "equal":
            insertions += j2 - j1
            deletions += i2 - i1
    return insertions, deletions


def hunks(a: list[str], b: list[str], ops: list[Opcode]) -> Iterator[str]:
    """The ``@@`` hunks of the unified diff, one line at a time (as difflib.unified_diff)."""
    for group in _grouped(ops, CONTEXT_LINES):
        first, last = group[0], group[-1]
        yield f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n"
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                yield from (_line(" ", line) for line in a[i1:i2])
                continue
            yield from (_line("-", line) for line in a[i1:i2])
            yield from (_line("+", line) for line in b[j1:j2])


def display(text: str) -> str:
    """``text`` made safe to serialise: undecodable file-name bytes become ``\\xNN``."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def shown_path(path: str) -> str:
    # A file name may hold a newline; quoted (as git does), it cannot forge diff lines.
    path = display(path)
    if any(ch < " " or ch in '"\\\x7f' for ch in path):
        return json.dumps(path, ensure_ascii=False)
    return path


class DiffWriter:
    """Joins per-file diffs into one text, cut per file and in total with a marker line."""

    def __init__(self, per_file: int, total: int, max_files: int | None = None) -> None:
        self._per_file = per_file
        self._left = total
        self._total = total
        self._files_left = max_files
        self._max_files = max_files
        self._parts: list[str] = []
        self._omitted = 0
        self._omitted_by_count = 0
        self.truncated = False

    def add(
        self, path: str, created: bool, deleted: bool, hunks: Iterator[str] | None, summary: str
    ) -> None:
        """Append one file's diff: its hunks, or ``summary`` ("Files {} and {} differ")."""
        if self._files_left is not None and self._files_left <= 0:
            self._omitted_by_count += 1
            return
        if self._left <= 0:
            self._omitted += 1
            return
        if self._files_left is not None:
            self._files_left -= 1
        a = "/dev/null" if created else shown_path("a/" + path)
        b = "/dev/null" if deleted else shown_path("b/" + path)
        if hunks is None:
            lines: Iterable[str] = [summary.format(a, b) + "\n"]
        else:
            lines = chain([f"--- {a}\n", f"+++ {b}\n"], hunks)
        per_file = self._per_file <= self._left
        budget = self._per_file if per_file else self._left
        used = 0
        for line in lines:  # lazily: the hunks past the cut are never formatted
            size = len(line) if line.isascii() else len(line.encode())
            if used + size > budget:
                self.truncated = True
                limit = (
                    f"per-file limit of {budget}" if per_file else f"total limit of {self._total}"
                )
                self._parts.append(
                    f"[... diff of {shown_path(path)} cut here: {limit} bytes reached ...]\n"
                )
                used = used if per_file else budget  # a total cut leaves nothing for others
                break
            self._parts.append(line)
            used += size
        self._left -= used

    def text(self) -> str:
        self._tell_omitted(
            self._omitted_by_count,
            f"the diff covers at most {self._max_files} files (max_files_with_diff)",
        )
        self._tell_omitted(self._omitted, f"the diff reached its limit of {self._total} bytes")
        self._omitted_by_count = self._omitted = 0
        return "".join(self._parts)

    def _tell_omitted(self, count: int, why: str) -> None:
        if count:
            self.truncated = True
            self._parts.append(f"[... {count} more changed file(s) not shown: {why} ...]\n")


def _line(sign: str, line: str) -> str:
    if line.endswith("\n"):
        return sign + line
    return f"{sign}{line}\n\\ No newline at end of file\n"


def _range(start: int, stop: int) -> str:
    # difflib._format_range_unified: "start,length", 1-based; "start" alone for one line.
    length = stop - start
    if length == 1:
        return str(start + 1)
    return f"{start if length == 0 else start + 1},{length}"


def _grouped(ops: list[Opcode], context: int) -> Iterator[list[Opcode]]:
    # difflib.SequenceMatcher.get_grouped_opcodes, over opcodes computed above.
    if not any(op[0] != "equal" for op in ops):
        return
    codes = list(ops)
    if codes[0][0] == "equal":
        tag, i1, i2, j1, j2 = codes[0]
        codes[0] = tag, max(i1, i2 - context), i2, max(j1, j2 - context), j2
    if codes[-1][0] == "equal":
        tag, i1, i2, j1, j2 = codes[-1]
        codes[-1] = tag, i1, min(i2, i1 + context), j1, min(j2, j1 + context)
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * context:
            group.append((tag, i1, min(i2, i1 + context), j1, min(j2, j1 + context)))
            yield group
            group = []
            i1, j1 = max(i1, i2 - context), max(j1, j2 - context)
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        yield group
