"""A comparison as Markdown (a CI job's summary page) and JUnit XML (a CI system's test
report: each case a testcase, each regression a failure)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

SYMBOL = {
    "slower": "slower",
    "faster": "faster",
    "unchanged": "unchanged",
    "inconclusive": "inconclusive",
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


def markdown(frame, title: str, header_lines: list[str]) -> str:
    """A GitHub-flavoured Markdown page: what was compared, the counts, one table row per case
    (regressions first)."""
    coverage = frame.ci_coverage.dropna()
    label = f"{100 * coverage.iloc[0]:.0f}% CI" if len(coverage) else "CI"
    order = {v: i for i, v in enumerate(SYMBOL)}
    rows = frame.sort_values("verdict", key=lambda s: s.map(order), kind="stable")
    lines = [f"## {title}", ""]
    lines += [f"- {line}" for line in header_lines]
    lines += ["- " + ", ".join(f"{n} {v}" for v, n in counts(frame).items()), ""]
    lines += [
        f"| case | unit | baseline | candidate | ratio ({label}) | q | detects | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows.itertuples():
        verdict = f"**{r.verdict}**" if r.verdict == "slower" else r.verdict
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


def junit(frame, suite: str, properties: dict[str, str]) -> str:
    """JUnit XML (the testsuite / testcase / failure schema CI systems read): a regression is
    a failure, a case that cannot be compared is skipped, the rest pass."""
    failures = int((frame.verdict == "slower").sum())
    skipped = int(frame.verdict.isin(["not comparable", "inconclusive"]).sum())
    root = ET.Element(
        "testsuite",
        {
            "name": suite,
            "tests": str(len(frame)),
            "failures": str(failures),
            "errors": "0",
            "skipped": str(skipped),
            "time": "0",
        },
    )
    props = ET.SubElement(root, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", {"name": key, "value": str(value)})
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
        elif r.verdict in ("not comparable", "inconclusive"):
            ET.SubElement(case, "skipped", {"message": f"{r.verdict}: {r.reason or detail}"})
        else:
            out = ET.SubElement(case, "system-out")
            out.text = f"{r.verdict}: {detail}"
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
