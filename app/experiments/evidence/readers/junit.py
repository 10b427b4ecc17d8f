"""Reads JUnit XML, from a report file (pytest --junitxml) or inside stdout.

The report is the tenant's (its conftest.py may write anything there, up to the 20 MB
read), so it is parsed as a stream and never built into a tree: 20 MB of nested
elements as an ElementTree took the server from 121 MB to 1.8 GB. The parser calls
``_Reader`` for each start and end tag (no text is collected), fed 64 KiB at a time so
that no single step holds the GIL for long, and stops at the first of ``MAX_DEPTH``,
``MAX_ELEMENTS`` or ``MAX_TEST_CASES``: the counts so far are the result, with a note
naming the cap. Its memory is the report's bytes, the open elements (at most
``MAX_DEPTH``) and the failing names ``Tally`` keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from xml.sax import SAXException
from xml.sax.handler import ContentHandler
from xml.sax.xmlreader import AttributesImpl

from defusedxml import DefusedXmlException, DTDForbidden
from defusedxml.expatreader import DefusedExpatParser

from app.experiments.evidence.readers._common import Inputs, Tally, Unreadable, _num

# Real reports nest four deep (testsuites, testsuite, testcase, failure), a few
# producers nest suites; a pytest case is one to three elements.
MAX_DEPTH = 64
MAX_ELEMENTS = 500_000
MAX_TEST_CASES = 100_000
# A failure's message attribute holds an exception's message: kilobytes, rarely more.
MAX_TOKEN_BYTES = 1024 * 1024
FEED_BYTES = 64 * 1024

_OUTCOMES = frozenset({"failure", "error", "skipped"})


def junit(inputs: Inputs) -> Tally | None:
    return junit_text(inputs.report, "pytest") if inputs.report else None


def junit_in_output(inputs: Inputs) -> Tally | None:
    text = inputs.stdout
    start = text.find("<testsuite")
    if start < 0:
        return None
    decl = text.rfind("<?xml", 0, start)
    end = max(text.rfind("</testsuites>"), text.rfind("</testsuite>"))
    if end < start:
        return None
    body = text[decl if decl >= 0 else start : text.index(">", end) + 1]
    return junit_text(body, "junit")


def junit_text(text: str | bytes, runner: str) -> Tally:
    # The report comes from a hostile container: no DTD is accepted at all, so no entity
    # either (one can only be declared in a DTD). A DOCTYPE comes before the root, so it
    # is refused before anything else is read. (A regular expression over the whole
    # report, as before, held the GIL 50-70 ms for 15 MB.)
    reader = _Reader(Tally(runner))
    parser = DefusedExpatParser(forbid_dtd=True)  # namespaces off: see the module doc
    parser.setContentHandler(reader)
    try:
        quiet = 0  # bytes fed since the parser last gave anything out
        for at in range(0, len(text), FEED_BYTES):
            seen = reader.events
            parser.feed(text[at : at + FEED_BYTES])
            quiet = quiet + FEED_BYTES if reader.events == seen else 0
            if quiet > MAX_TOKEN_BYTES:
                raise _Capped(
                    f"has a tag or comment longer than {MAX_TOKEN_BYTES // 2**20} MiB "
                    "(cap MAX_TOKEN_BYTES)"
                )
        parser.close()
    except _Capped as capped:
        reader.tally.notes.append(f"the JUnit XML {capped}; read it up to there")
    except DTDForbidden:
        raise Unreadable("the JUnit XML declares a DOCTYPE or ENTITY; refused it unread") from None
    except DefusedXmlException as exc:
        raise Unreadable(f"the JUnit XML was refused ({type(exc).__name__})") from None
    except SAXException as exc:
        raise Unreadable(f"the JUnit XML is not well-formed ({exc})") from None
    tally = reader.tally
    tally.duration_s = reader.root_time or sum(reader.suite_times)
    return tally


class _Capped(Exception):
    """A cap was reached; the message says which, for the note."""


@dataclass
class _Case:
    name: str
    outcomes: set[str] = field(default_factory=set)


@dataclass
class _Reader(ContentHandler):
    """The parser's handler: counts the test cases as their end tags arrive."""

    tally: Tally
    events: int = 0  # tags and stretches of text given out so far
    open: list[_Case | None] = field(default_factory=list)  # a _Case for an open <testcase>
    elements: int = 0
    cases: int = 0
    root_time: float | None = None
    suite_times: list[float] = field(default_factory=list)

    def startElement(self, tag: str, attrib: AttributesImpl) -> None:
        self.events += 1
        if not self.open and tag not in ("testsuites", "testsuite"):
            raise Unreadable(f"the XML report's root is <{tag[:40]}>, not <testsuites>")
        self.elements += 1
        if len(self.open) >= MAX_DEPTH:
            raise _Capped(f"nests deeper than {MAX_DEPTH} elements (cap MAX_DEPTH)")
        if self.elements > MAX_ELEMENTS:
            raise _Capped(f"has more than {MAX_ELEMENTS:,} elements (cap MAX_ELEMENTS)")
        if not self.open:
            self.root_time = _num(attrib.get("time"))
        if tag == "testsuite" and (time := _num(attrib.get("time"))) is not None:
            self.suite_times.append(time)
        parent = self.open[-1] if self.open else None
        if parent is not None and tag in _OUTCOMES:
            parent.outcomes.add(tag)
        if tag == "testcase":
            self.cases += 1
            if self.cases > MAX_TEST_CASES:
                raise _Capped(f"has more than {MAX_TEST_CASES:,} test cases (cap MAX_TEST_CASES)")
            self.open.append(_Case(_junit_name(attrib)))
        else:
            self.open.append(None)

    def endElement(self, tag: str) -> None:
        self.events += 1
        case = self.open.pop()
        if case is None:
            return
        if "failure" in case.outcomes:
            self.tally.fail(case.name)
        elif "error" in case.outcomes:
            self.tally.fail(case.name, error=True)
        elif "skipped" in case.outcomes:
            self.tally.skipped += 1
        else:
            self.tally.passed += 1

    def characters(self, content: str) -> None:
        self.events += 1  # text is given out as it is fed (only the tags are read)


def _junit_name(attrib: AttributesImpl) -> str:
    """pytest's node id when the report has ``file`` (``junit_family=xunit1``), else class.name."""
    name, classname, file = attrib.get("name", ""), attrib.get("classname", ""), attrib.get("file")
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        if not classname:
            return file  # a collection error: the module itself failed
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}"
    return f"{classname}.{name}" if classname else name
