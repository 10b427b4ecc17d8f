"""Reads cargo test's text output (libtest's summary lines)."""

from __future__ import annotations

import re

from app.experiments.evidence.readers._common import Inputs, Tally, Unreadable, _lines, _num

# --- cargo test (libtest's text; its JSON output needs a nightly toolchain) --------------------

_CARGO_RESULT = re.compile(
    r"^test result: (?:ok|FAILED)\. (\d+) passed; (\d+) failed; (\d+) ignored; (\d+) measured;"
    r".*?(?:finished in ([\d.]+)s)?$"
)
_CARGO_FAILED = re.compile(r"^test (.+?) \.\.\. FAILED$")
_CARGO_STDOUT = re.compile(r"^---- (.+?) std(?:out|err) ----$")


def cargo_text(inputs: Inputs) -> Tally | None:
    tally = Tally("cargo", duration_s=0.0)
    results = 0
    for line in _lines(inputs.stdout):
        if match := _CARGO_RESULT.match(line):
            results += 1
            tally.passed += int(match[1]) + int(match[4])
            tally.failed += int(match[2])
            tally.skipped += int(match[3])
            tally.duration_s = (tally.duration_s or 0) + (_num(match[5]) or 0)
        elif match := _CARGO_FAILED.match(line) or _CARGO_STDOUT.match(line):
            tally.failing.append(match[1].removesuffix(" - should panic"))
    if results == 0:
        if re.search(r"(?m)^error(\[E\d+\])?: (could not compile|.*)", inputs.stderr):
            raise Unreadable("cargo printed no test result: the crate did not compile")
        return None
    return tally
