"""Tenant-supplied patterns (search regexes, artifact globs), compiled so they cannot backtrack.

Python's ``re`` backtracks: ``(a+)+$`` over one 27-character line took 13.5 s and
held the GIL throughout, so running it in a worker thread did not spare the event
loop, and ``*a*a*a*a*a*a*b`` as a glob did the same to a file name. RE2 matches in
time linear in the text, never backtracks, releases the GIL while it matches, and
caps its memory; what it cannot do without backtracking (backreferences,
lookaround) it refuses, and we say which construct was refused.
"""

from __future__ import annotations

import re
from typing import Any

import re2  # type: ignore[import-untyped]  # google-re2 ships no type information

from app.errors import InvalidArgument

MAX_REGEX_LENGTH = 1000
# RE2 falls back from its DFA to a much slower (still linear) matcher when the
# DFA outgrows this, so it is a cap, not a target: 8 MiB is RE2's own default.
REGEX_MAX_MEM = 8 * 1024 * 1024
# Globs compile to small automata, and a call may bring 20 of them.
GLOB_MAX_MEM = 1024 * 1024

SYNTAX_HINT = (
    "Patterns use RE2 syntax: Python's, without backreferences or lookaround; inline "
    "flags i, m, s and U; \\d, \\w, \\b and \\s are ASCII (\\pL and \\pN cover every script)."
)

# RE2's error names the operator it stopped at; say what it is in words.
_UNSUPPORTED_GROUPS = (
    ("(?P=", "named backreferences (?P=name)"),
    ("(?P>", "recursion (?P>name)"),
    ("(?<=", "lookbehind (?<=...)"),
    ("(?<!", "negative lookbehind (?<!...)"),
    ("(?=", "lookahead (?=...)"),
    ("(?!", "negative lookahead (?!...)"),
    ("(?>", "atomic groups (?>...)"),
    ("(?#", "comments (?#...)"),
    ("(?(", "conditionals (?(group)yes|no)"),
)
_RE2_ERROR = re.compile(r"(?P<kind>[a-z ]+): (?P<fragment>.*)", re.DOTALL)
_BACKREFERENCE = re.compile(r"\\[1-9]")
_HEX = frozenset("0123456789abcdefABCDEF")
_OPEN_LOWER_BOUND = re.compile(r"\{,[0-9]+\}")  # Python's x{,3}; RE2 would read it literally
# Lone surrogates (from JSON, or os.fsdecode of a non-UTF-8 file name) pass through
# as their three bytes, which RE2 reads as one character, as Python's re did.
_ENCODING = ("utf-8", "surrogatepass")


class InvalidPattern(InvalidArgument):
    """A search regex or glob that is too long, malformed, or needs backtracking."""


class Matcher:
    """A compiled pattern; each test takes time linear in the text."""

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled

    def search(self, text: str) -> bool:
        """Whether the pattern occurs anywhere in ``text``."""
        # Bytes skip the wrapper's character-offset bookkeeping (4x faster per line).
        return self._compiled.search(text.encode(*_ENCODING)) is not None

    def fullmatch(self, text: str) -> bool:
        """Whether the pattern matches the whole of ``text``."""
        return self._compiled.fullmatch(text.encode(*_ENCODING)) is not None


def compile_search(pattern: str) -> Matcher:
    """Compile a ``search_sandbox`` regular expression (RE2 syntax, a few Python spellings).

    Raises:
        InvalidPattern: too long, malformed, or using syntax RE2 lacks (named in the message).
    """
    if len(pattern) > MAX_REGEX_LENGTH:
        raise InvalidPattern(
            f"The pattern is too long (at most {MAX_REGEX_LENGTH} characters).",
            length=len(pattern),
        )
    translated = _from_python_syntax(pattern).encode(*_ENCODING)
    return Matcher(_compile(translated, pattern, REGEX_MAX_MEM))


def compile_glob(glob: str) -> Matcher:
    """Compile an artifact glob: ``*`` within a folder, ``**/`` any folders, ``?`` one char.

    The whole path must match (use :meth:`Matcher.fullmatch`); every other
    character is literal.
    """
    out = [b"(?s)"]  # a file name may hold a newline: ** and ? cover it too
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append(b"(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(b".*")
            i += 2
        elif glob[i] == "*":
            out.append(b"[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append(b"[^/]")
            i += 1
        else:
            out.append(re2.escape(glob[i].encode(*_ENCODING)))
            i += 1
    return Matcher(_compile(b"".join(out), glob, GLOB_MAX_MEM))


def _from_python_syntax(pattern: str) -> str:
    """Rewrite the Python spellings RE2 writes otherwise: ``\\Z``, ``\\uXXXX``, ``x{,n}``.

    A small scanner rather than a regex substitution, so that an escaped
    backslash (``\\\\Z``) and the inside of a character class are left alone.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    class_body = -1  # index where the current [...] class's members start; -1: outside
    while i < n:
        char = pattern[i]
        if char == "\\":
            escape = pattern[i : i + 2]
            width = {"\\u": 4, "\\U": 8}.get(escape, 0)
            digits = pattern[i + 2 : i + 2 + width]
            if escape == "\\Z" and class_body < 0:
                out.append("\\z")
            elif width and len(digits) == width and set(digits) <= _HEX:
                out.append(f"\\x{{{digits}}}")
                i += width
            else:
                out.append(escape)
            i += 2
            continue
        if class_body >= 0:
            posix_end = pattern.find(":]", i + 2) if pattern.startswith("[:", i) else -1
            if posix_end >= 0:  # [:alpha:] inside a class: its "]" does not close the class
                out.append(pattern[i : posix_end + 2])
                i = posix_end + 2
                continue
            if char == "]" and i > class_body:  # a "]" first in the class is a member
                class_body = -1
        elif char == "[":
            class_body = i + 1 + (pattern[i + 1 : i + 2] == "^")
            out.append(pattern[i:class_body])
            i = class_body
            continue
        elif char == "{" and _OPEN_LOWER_BOUND.match(pattern, i):
            out.append("{0")
            i += 1
            continue
        out.append(char)
        i += 1
    return "".join(out)


def _compile(translated: bytes, shown: str, max_mem: int) -> Any:
    options = re2.Options()
    options.max_mem = max_mem
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    options.never_capture = True  # only "does it match" is asked: no submatch bookkeeping
    try:
        compiled = re2.compile(translated, options)
    except re2.error as exc:
        raise InvalidPattern(_explain(exc, shown), pattern=shown[:200]) from None
    finally:
        # re2 keeps its last 128 patterns, each holding up to max_mem of automaton:
        # tenant patterns are one-off, so none is kept past the call that uses it.
        re2.purge()
    return compiled


def _explain(exc: Exception, pattern: str) -> str:
    raw = exc.args[0] if exc.args else ""
    message = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    parsed = _RE2_ERROR.fullmatch(message)
    kind, fragment = (parsed["kind"], parsed["fragment"]) if parsed else ("", message)
    unsupported = _unsupported(kind, fragment, pattern)
    if unsupported:
        return f"The pattern uses {unsupported}, which RE2 does not support. {SYNTAX_HINT}"
    if "too large" in message:
        return (
            "The pattern compiles to more than the server allows; make it smaller "
            "(fewer or smaller repetition counts)."
        )
    return f"The pattern is not a valid regular expression: {message}. {SYNTAX_HINT}"


def _unsupported(kind: str, fragment: str, pattern: str) -> str | None:
    if kind == "invalid perl operator":
        for opening, name in _UNSUPPORTED_GROUPS:
            # RE2 quotes only "(?P" for both (?P=...) and (?P>...): look in the pattern.
            quoted_short = fragment == "(?P" and opening.startswith("(?P")
            if fragment.startswith(opening) or (quoted_short and opening in pattern):
                return name
        if re.fullmatch(r"\(\?[-a-zA-Z]+", fragment):
            return f"the inline flag {fragment[-1]!r} (in {fragment!r})"
    if kind == "invalid escape sequence" and _BACKREFERENCE.fullmatch(fragment):
        return f"a backreference ({fragment})"
    if kind == "bad repetition operator" and fragment in ("++", "*+", "?+"):
        return f"a possessive quantifier ({fragment})"
    if kind == "invalid repetition size":
        return f"a repetition count over 1000 at {fragment} (nested counts multiply)"
    return None
