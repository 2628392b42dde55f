"""A comparison as Markdown (a CI job's summary page) and JUnit XML (a CI system's test
report: each case a testcase, each regression a failure)."""

from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

SYMBOL = {
    "slower": "slower",
    "faster": "faster",
    "unchanged": "unchanged",
    "inconclusive": "inconclusive",
    "missing": "missing",
    "not comparable": "not comparable",
}


def _num(x: float) -> str:
    if x is None or x != x:
        return "-"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _ratio(r) -> str:
    if r.ratio != r.ratio:
        return "-"
    return f"{r.ratio:.3f} ({_num(r.ratio_low)}-{_num(r.ratio_high)})"


def _percent(x: float) -> str:
    return "-" if x is None or x != x else f"{100 * x:.0f}%"


def counts(frame) -> dict[str, int]:
    return {v: int((frame.verdict == v).sum()) for v in SYMBOL if (frame.verdict == v).any()}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def gate_line(problems: list[str], failed: bool) -> list[str]:
    """The Markdown lines that say why the gate failed (or what it was told to let pass)."""
    if not problems:
        return []
    head = "**gate failed**" if failed else "allowed to pass (--allow-missing)"
    return [f"- {head}: {p}" for p in problems]


def markdown(
    frame, title: str, header_lines: list[str], problems: list[str] = (), failed: bool = True
) -> str:
    """A GitHub-flavoured Markdown page: what was compared, the counts, why the gate failed
    if it did for want of cases, one table row per case (regressions and missing first)."""
    coverage = frame.ci_coverage.dropna()
    label = f"{100 * coverage.iloc[0]:.0f}% CI" if len(coverage) else "CI"
    order = {v: i for i, v in enumerate(dict.fromkeys(["slower", "missing", *SYMBOL]))}
    rows = frame.sort_values("verdict", key=lambda s: s.map(order), kind="stable")
    lines = [f"## {title}", ""]
    lines += [f"- {line}" for line in header_lines]
    lines += ["- " + ", ".join(f"{n} {v}" for v, n in counts(frame).items())]
    lines += gate_line(list(problems), failed) + [""]
    lines += [
        f"| case | unit | baseline | candidate | ratio ({label}) | q | detects | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows.itertuples():
        verdict = f"**{r.verdict}**" if r.verdict in ("slower", "missing") else r.verdict
        if r.reason:
            verdict += f" ({r.reason})"
        lines.append(
            "| "
            + " | ".join(
                _cell(x)
                for x in (
                    r.case,
                    r.unit,
                    _num(getattr(r, "baseline", math.nan)),
                    _num(getattr(r, "candidate", math.nan)),
                    _ratio(r),
                    _num(r.q_value),
                    _percent(getattr(r, "detectable", math.nan)),
                    verdict,
                )
            )
            + " |"
        )
    return "\n".join(lines) + "\n"


def _suite(suite: str, properties: dict, tests: int, failures: int, errors: int, skipped: int):
    root = ET.Element(
        "testsuite",
        {
            "name": suite,
            "tests": str(tests),
            "failures": str(failures),
            "errors": str(errors),
            "skipped": str(skipped),
            "time": "0",
        },
    )
    props = ET.SubElement(root, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", {"name": key, "value": str(value)})
    return root


# Characters XML 1.0 forbids (a NUL from a library's version string, say): dropped, else a
# CI system cannot read the report at all
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f]")


def _xml(root) -> str:
    for element in root.iter():
        element.attrib.update({k: _NOT_XML.sub("", v) for k, v in element.attrib.items()})
        if element.text:
            element.text = _NOT_XML.sub("", element.text)
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def junit(
    frame, suite: str, properties: dict[str, str], problems: list[str] = (), failed: bool = True
) -> str:
    """JUnit XML (the testsuite / testcase / failure schema CI systems read): a regression is
    a failure, and so is a case of the baseline missing in the candidate; a candidate that is
    not a whole run is one more failed testcase (``candidate run``); an inconclusive case, or
    one only the candidate has, is skipped; the rest pass. ``failed`` False (--allow-missing)
    turns the missing ones into skips."""
    missing = "failure" if failed else "skipped"
    whole = [p for p in problems if p.startswith("the candidate")]
    failures = int((frame.verdict == "slower").sum())
    failures += int((frame.verdict == "missing").sum()) if failed else 0
    failures += int(bool(whole) and failed)
    skipped = int(frame.verdict.isin(["not comparable", "inconclusive"]).sum())
    skipped += 0 if failed else int((frame.verdict == "missing").sum()) + int(bool(whole))
    root = _suite(suite, properties, len(frame) + int(bool(whole)), failures, 0, skipped)
    if whole:
        case = ET.SubElement(root, "testcase", {"classname": suite, "name": "candidate run"})
        if failed:
            ET.SubElement(
                case, "failure", {"message": whole[0], "type": "incomplete"}
            ).text = f"{whole[0]}: the cases it lacks were not checked"
        else:
            ET.SubElement(case, "skipped", {"message": f"{whole[0]} (--allow-missing)"})
    for r in frame.itertuples():
        case = ET.SubElement(root, "testcase", {"classname": suite, "name": r.case, "time": "0"})
        detail = (
            f"ratio {_ratio(r)}, q {_num(r.q_value)}, baseline {_num(getattr(r, 'baseline', math.nan))} "
            f"{r.unit}, candidate {_num(getattr(r, 'candidate', math.nan))} {r.unit}"
        )
        if r.verdict == "slower":
            failure = ET.SubElement(
                case, "failure", {"message": f"slower: {detail}", "type": "regression"}
            )
            failure.text = f"{r.case}: {detail} ({r.test})"
        elif r.verdict == "missing":
            attrs = {"message": f"missing: {r.reason}", **({"type": "missing"} if failed else {})}
            ET.SubElement(case, missing, attrs).text = f"{r.case}: {r.reason}"
        elif r.verdict in ("not comparable", "inconclusive"):
            ET.SubElement(case, "skipped", {"message": f"{r.verdict}: {r.reason or detail}"})
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"{r.verdict}: {detail}"
    return _xml(root)


def markdown_error(title: str, message: str) -> str:
    """The Markdown page of a comparison that could not be made, saying why."""
    return f"## {title}\n\n- **gate failed**: {message}\n"


def junit_error(suite: str, properties: dict[str, str], message: str) -> str:
    """JUnit XML of a comparison that could not be made: one testcase in error, saying why
    (a CI system then shows a red job with the reason, never an empty report)."""
    root = _suite(suite, properties, 1, 0, 1, 0)
    case = ET.SubElement(root, "testcase", {"classname": suite, "name": "comparison"})
    ET.SubElement(case, "error", {"message": message, "type": "not comparable"}).text = message
    return _xml(root)
