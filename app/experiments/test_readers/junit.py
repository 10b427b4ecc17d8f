"""Reads JUnit XML, from a report file (pytest --junitxml) or inside stdout."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from defusedxml import DefusedXmlException
from defusedxml.ElementTree import fromstring as defused_fromstring

from app.experiments.test_readers._common import Inputs, Tally, Unreadable, _num

# --- JUnit XML (pytest --junitxml, and other producers) ----------------------------------------

_XML_REFUSED = re.compile(r"<!\s*(DOCTYPE|ENTITY)", re.IGNORECASE)


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


def junit_text(text: str, runner: str) -> Tally:
    # The report comes from a hostile container: no DTD is accepted at all (refused
    # unread here), and defusedxml refuses entities and external references again.
    if _XML_REFUSED.search(text):
        raise Unreadable("the JUnit XML declares a DOCTYPE or ENTITY; refused it unread")
    try:
        root = defused_fromstring(text)
    except DefusedXmlException as exc:
        raise Unreadable(f"the JUnit XML was refused ({type(exc).__name__})") from None
    except ET.ParseError as exc:
        raise Unreadable(f"the JUnit XML is not well-formed ({exc})") from None
    if root.tag not in ("testsuites", "testsuite"):
        raise Unreadable(f"the XML report's root is <{root.tag[:40]}>, not <testsuites>")
    tally = Tally(runner)
    for case in root.iter("testcase"):
        outcomes = {child.tag for child in case}
        if "failure" in outcomes:
            tally.fail(_junit_name(case))
        elif "error" in outcomes:
            tally.fail(_junit_name(case), error=True)
        elif "skipped" in outcomes:
            tally.skipped += 1
        else:
            tally.passed += 1
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    times = [_num(suite.get("time")) for suite in suites]
    tally.duration_s = _num(root.get("time")) or sum(t for t in times if t is not None)
    return tally


def _junit_name(case: ET.Element) -> str:
    """pytest's node id when the report has ``file`` (``junit_family=xunit1``), else class.name."""
    name, classname, file = case.get("name", ""), case.get("classname", ""), case.get("file")
    if file and file.endswith(".py"):
        module = file[:-3].replace("/", ".")
        if not classname:
            return file  # a collection error: the module itself failed
        if classname == module:
            return f"{file}::{name}"
        if classname.startswith(module + "."):
            return f"{file}::{classname[len(module) + 1 :].replace('.', '::')}::{name}"
    return f"{classname}.{name}" if classname else name
