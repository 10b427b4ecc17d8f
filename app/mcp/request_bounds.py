"""What a ``/mcp`` request body may cost before the SDK parses it.

The SDK parses a body (up to its 4 MiB cap) in one call on the event loop, and what
that costs grows with the body's JSON values, not its bytes: 4 MiB of ``[{},{},...]``
held the loop 180-200 ms and took 81 MB, 4 MiB of one string 6-11 ms, of one string
of escapes 27-40 ms. The largest legitimate body is a write_sandbox_file (or
edit_sandbox_file) with its content, one long string; no tool takes more than a few
hundred values (50 setup commands, 100 environment entries, 20 patterns).

So a body over ``LARGE_BODY`` bytes is measured first, in the caller's thread share,
and refused when it holds more than ``MAX_VALUES`` values or ``MAX_ESCAPES``
backslashes (what the SDK then parses costs it a few milliseconds); and one sign-in
address has at most ``LARGE_PER_ADDRESS`` such bodies in flight, from the moment one
passes ``LARGE_BODY`` bytes until its call has been answered, so their memory is
bounded per address as well as per call.

The values are counted, not parsed: commas, brackets and braces outside strings, and
the strings. A parser would not do: ``json`` holds the GIL (and so the loop) for the
whole parse even in a thread, and ijson took 5 s on a 4 MiB string of escapes. The
count walks from string to string with ``bytes.find`` and ``bytes.count``, each step
short, and stops as soon as the cap is passed.
"""

from __future__ import annotations

from collections import Counter

LARGE_BODY = 64 * 1024
MAX_VALUES = 20_000
MAX_ESCAPES = 1_048_576  # a quarter of a 4 MiB body; the SDK decodes them in ~15 ms
LARGE_PER_ADDRESS = 4

_STRUCTURAL = (b",", b"[", b"{")
# Each count covers at most this much of the body: one C call holds the GIL, and so
# the loop, for well under a millisecond.
_WINDOW = 256 * 1024
_QUOTE = b'"'
_BACKSLASH = 0x5C


def refusal(body: bytes) -> str | None:
    """Why the SDK should not parse ``body`` (a sentence for the agent), or None.

    Blocking (a few ms to a few hundred for 4 MiB): run it in a worker thread."""
    escapes = _count(body, (b"\\",), 0, len(body))
    if escapes > MAX_ESCAPES:
        return (
            f"This request holds {escapes:,} escaped characters; the server parses at most "
            f"{MAX_ESCAPES:,} in one request. Send the content in several smaller writes."
        )
    if _too_many_values(body, MAX_VALUES):
        return (
            f"This request holds more than {MAX_VALUES:,} JSON values; no tool takes that "
            "many. Send fewer arguments, or long text as one string."
        )
    return None


def _too_many_values(body: bytes, cap: int) -> bool:
    """Whether ``body`` holds more than ``cap`` values, counted as its commas, brackets
    and braces outside strings plus its strings (an upper bound of the values)."""
    if _count(body, _STRUCTURAL, 0, len(body)) <= cap:
        return False  # even counting those inside strings: the common case, one pass
    count, pos, end = 0, 0, len(body)
    while pos < end:
        opening = body.find(_QUOTE, pos)
        stop = end if opening < 0 else opening
        count += _count(body, _STRUCTURAL, pos, stop)
        if opening < 0 or count > cap:
            return count > cap
        pos = _string_end(body, opening + 1)
        count += 1
    return count > cap


def _count(body: bytes, subs: tuple[bytes, ...], start: int, end: int) -> int:
    """How many of ``subs`` (single bytes) are in ``body[start:end]``, a window at a time."""
    return sum(
        body.count(sub, at, min(at + _WINDOW, end))
        for at in range(start, end, _WINDOW)
        for sub in subs
    )


def _string_end(body: bytes, pos: int) -> int:
    """Just past the quote that closes the string whose text starts at ``pos`` (the
    body's end if none does: the SDK answers the parse error). Steps once per escaped
    quote, and looks back over each run of backslashes once: at most ``MAX_ESCAPES``."""
    while True:
        closing = body.find(_QUOTE, pos)
        if closing < 0:
            return len(body)
        run = 0
        while body[closing - 1 - run] == _BACKSLASH:
            run += 1
        pos = closing + 1
        if run % 2 == 0:
            return pos


class LargeBodies:
    """How many large bodies each sign-in address has in flight."""

    def __init__(self, per_address: int = LARGE_PER_ADDRESS) -> None:
        self.per_address = per_address
        self._open: Counter[str] = Counter()

    def enter(self, address: str) -> bool:
        """Count one more for ``address``; False (and nothing counted) at its bound."""
        if self._open[address] >= self.per_address:
            return False
        self._open[address] += 1
        return True

    def leave(self, address: str) -> None:
        self._open[address] -= 1
        if self._open[address] <= 0:
            del self._open[address]
