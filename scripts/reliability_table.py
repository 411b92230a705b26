"""Measure every row of the reliability matrix and write docs/reliability.md.

Each row of docs/reliability_policy.md §6 (I1-I16, V1-V21, P1-P10, C1-C10, N1-N15, S1-S13, H1-H7, R1-R4, A1-A9,
U1-U8, E1-E9) is mapped below to the tests that reproduce its fault and check its pass criterion. The script runs pytest
on exactly those tests (one session, a junit XML), and fills the result column from what pytest reported, so
the table is measured:

- pass: every listed test passed (a strict xfail that states a measured deviation from the matrix's literal
  criterion is shown as such, beside the passing tests of the criterion we assert);
- fail: a listed test failed or errored, or is missing from the run (renamed or deleted);
- not run: every listed test was skipped (the reason is shown).

The S11 row also quotes the last full soak (scripts/soak.py), read from docs/reliability_soak.json when present.

    python scripts/reliability_table.py              # run the tests, write docs/reliability.md
    python scripts/reliability_table.py --junit F    # reuse a junit XML from an earlier run
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))  # reliability_rows, beside this script, when imported from elsewhere

from reliability_rows import ROWS, Row  # noqa: E402


@dataclass
class Outcome:
    passed: int = 0
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    xfailed: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return self.passed + len(self.failed) + len(self.skipped) + len(self.xfailed)


def node_ids() -> list[str]:
    """Unique test functions, files in the order `make test` runs them (alphabetical paths): some tests kill
    every child process of the session (V8), which must happen before tests/ui starts its `vl app`."""
    seen, out = set(), []
    for row in ROWS:
        for t in row.tests:
            base = t.split("[")[0]
            if base not in seen:
                seen.add(base)
                out.append(base)
    order = {f: i for i, f in enumerate(sorted({t.split("::")[0] for t in out}))}
    return sorted(out, key=lambda t: order[t.split("::")[0]])  # stable: function order kept within a file


def run_pytest(junit: Path, extra: list[str]) -> int:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", f"--junitxml={junit}", *extra,
           *node_ids()]
    print("running:", " ".join(cmd[:8]), f"... ({len(node_ids())} test functions)", file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def read_junit(path: Path) -> dict[str, tuple[str, str, float]]:
    """{'path::name[param]': (status, message, seconds)} from a pytest junit XML."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "")
        file = module.replace(".", "/") + ".py"
        key = f"{file}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                status, message = "failed", (child.get("message") or "")[:200]
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                status, message = ("xfailed" if xfail else "skipped"), (child.get("message") or "")[:300]
        out[key] = (status, message, float(case.get("time", 0)))
    return out


def wall_seconds(path: Path) -> float:
    """The run's own duration from a pytest junit XML (its test suites' time; with test workers, less than the sum
    of the cases' times)."""
    return sum(float(s.get("time", 0)) for s in ET.parse(path).getroot().iter("testsuite"))


def outcome_for(test: str, results: dict) -> Outcome:
    o = Outcome()
    exact = "[" in test
    hits = [(k, v) for k, v in results.items() if (k == test if exact else k.split("[")[0] == test)]
    if not hits:
        o.failed.append(f"{test}: not found in the run")
    for key, (status, message, secs) in hits:
        o.seconds += secs
        if status == "passed":
            o.passed += 1
        elif status == "failed":
            o.failed.append(f"{key}: {message}")
        elif status == "xfailed":
            o.xfailed.append(message.removeprefix("reason: "))
        else:
            o.skipped.append(message)
    return o


def row_result(row: Row, results: dict) -> tuple[str, str, int]:
    outs = [outcome_for(t, results) for t in row.tests]
    failed = [f for o in outs for f in o.failed]
    cases = sum(o.total for o in outs)
    if failed:
        return "**fail**", "; ".join(failed)[:400], cases
    if all(o.passed == 0 and not o.xfailed for o in outs):
        reasons = sorted({s for o in outs for s in o.skipped})
        return "not run", "skipped: " + "; ".join(reasons)[:300], cases
    xfails = [x for o in outs for x in o.xfailed]
    skipped = sum(len(o.skipped) for o in outs)
    extra = []
    if xfails:
        extra.append("documented deviation (strict xfail): " + "; ".join(xfails))
    if skipped:
        extra.append(f"{skipped} case(s) skipped: " + "; ".join(sorted({s for o in outs for s in o.skipped}))[:200])
    return "pass" + (" (with a deviation)" if xfails else ""), " ".join(extra), cases


def soak_note(path: Path) -> str:
    if not path.is_file():
        return "full 10-minute soak: not recorded yet (python scripts/soak.py --out docs/reliability_soak.json)"
    s = json.loads(path.read_text())
    classes = ", ".join(f"{k} {v['tried']}" for k, v in s.get("by_class", {}).items() if k not in
                        ("image", "pdf", "video", "chat"))
    return (f"full soak ({s.get('model')}, {s.get('wall_s')} s at {s.get('requests_per_s')} req/s): "
            f"{s['valid']['served']}/{s['valid']['sent']} valid served, {s['bad']['refused_clearly']}/{s['bad']['sent']} "
            f"bad refused clearly ({classes}); RSS {s['start']['rss_bytes'] / 2**20:.0f} -> "
            f"{s['end']['rss_bytes'] / 2**20:.0f} MiB ({s.get('memory_growth', 0):+.1%}); fds {s['start']['fds_server']} "
            f"-> {s['end']['fds_server']}; processes {s['start']['processes']} -> {s['end']['processes']}; "
            f"{'PASS' if s.get('passed') else 'FAIL'}")


def esc(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(results: dict, junit_note: str, soak: Path) -> str:
    rows, counts = [], {"pass": 0, "fail": 0, "not run": 0}
    for row in ROWS:
        result, detail, cases = row_result(row, results)
        counts["fail" if "fail" in result else "not run" if result == "not run" else "pass"] += 1
        notes = " ".join(x for x in (row.note, detail, soak_note(soak) if row.id == "S11" else "") if x)
        tests = "<br>".join(f"`{t}`" for t in row.tests)
        rows.append(f"| {row.id} | {esc(row.fault)} | {esc(row.criterion)} | {tests} | {result} ({cases}) | "
                    f"{esc(notes)} |")
    head = [
        "# Reliability matrix: measured results",
        "",
        "Generated by `python scripts/reliability_table.py` (do not edit by hand): every row of "
        "`docs/reliability_policy.md` §6 with the tests that reproduce its fault and check its pass criterion, and "
        "the result pytest reported for them in one run. The number in brackets is the count of test cases "
        "(parametrizations included). See SECURITY.md for the threat model and the limits.",
        "",
        f"- run: {junit_note}",
        f"- rows: {counts['pass']} pass, {counts['fail']} fail, {counts['not run']} not run (of {len(ROWS)})",
        "",
        "| row | fault | pass criterion | tests | result | notes |",
        "|---|---|---|---|---|---|",
    ]
    return "\n".join(head + rows + soak_section(soak)) + "\n"


def soak_section(path: Path) -> list[str]:
    """The last full soak's figures, from the JSON that scripts/soak.py --out wrote."""
    if not path.is_file():
        return []
    s = json.loads(path.read_text())
    mib = 2**20
    out = ["", "## Soak (row S11)", "",
           f"`python scripts/soak.py --duration {s['duration_s']:g} --out {path.relative_to(REPO)}` against "
           f"`vl app` serving the {s['model']}: {s['requests_sent']} requests in {s['wall_s']} s "
           f"({s['requests_per_s']} per second, {s['bad_fraction']:.0%} bad), after a warm-up of one request per "
           f"class. Result: **{'PASS' if s.get('passed') else 'FAIL'}**.", "",
           "| figure | value |", "|---|---|",
           f"| valid requests served | {s['valid']['served']} of {s['valid']['sent']} (p50 {s['valid']['latency_p50_s']} s, "
           f"p95 {s['valid']['latency_p95_s']} s) |",
           f"| bad inputs refused with a clear message | {s['bad']['refused_clearly']} of {s['bad']['sent']} |",
           f"| bad inputs answered anyway / internal errors | {len(s['bad']['answered_anyway'])} / "
           f"{len(s['bad']['internal_errors'])} |",
           f"| crashes contained (bad inputs refused while the server stayed up) | {s['crashes_contained']} |",
           f"| server alive at the end | {s['server_alive_at_end']} |",
           f"| RSS, server + decode workers | {s['start']['rss_bytes'] / mib:.0f} MiB -> {s['end']['rss_bytes'] / mib:.0f} MiB "
           f"({s['memory_growth']:+.1%}); peak {s['peak_rss_bytes'] / mib:.0f} MiB |"]
    if "memory_growth_server_only" in s:
        out.append(f"| RSS, server process only | {s['start']['rss_server_bytes'] / mib:.0f} MiB -> "
                   f"{s['end']['rss_server_bytes'] / mib:.0f} MiB ({s['memory_growth_server_only']:+.1%}) |")
    if s.get("rss_slope_second_half_mb_per_min") is not None:
        out.append(f"| RSS slope over the second half | {s['rss_slope_second_half_mb_per_min']:+.2f} MiB/min |")
    out += [f"| open fds (server) | {s['start']['fds_server']} -> {s['end']['fds_server']} |",
            f"| processes (server + workers) | {s['start']['processes']} -> {s['end']['processes']} "
            f"(peak {s['peak_processes']}) |",
            f"| app temp-dir entries | {s['start']['temp_entries']} -> {s['end']['temp_entries']} |",
            f"| upload-folder files (removed by delete_cache after 1 h) | {s['start']['upload_files']} -> "
            f"{s['end']['upload_files']} |", "",
            "| class | tried | refused | example message |", "|---|---|---|---|"]
    for kind, c in s["by_class"].items():
        out.append(f"| {kind} | {c['tried']} | {c['refused']} | {esc(c['example_message'][:140]) or '(answered)'} |")
    checks = ", ".join(f"{k} {'yes' if v else '**no**'}" for k, v in s["checks"].items())
    out += ["", f"Checks: {checks}."]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--junit", type=Path, default=None, help="read this junit XML instead of running pytest")
    p.add_argument("--out", type=Path, default=REPO / "docs" / "reliability.md")
    p.add_argument("--soak", type=Path, default=REPO / "docs" / "reliability_soak.json")
    p.add_argument("--list", action="store_true", help="print the test node ids and exit")
    p.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(node_ids()))
        return 0
    junit = args.junit
    started = dt.datetime.now(dt.timezone.utc)
    if junit is None:
        junit = Path(tempfile.mkdtemp(prefix="vl-reliability-")) / "junit.xml"
        run_pytest(junit, args.pytest_args)
    results = read_junit(junit)
    if args.junit is None:
        when = started.strftime("%Y-%m-%d %H:%M UTC")
    else:  # the run's own time (the junit file's), not where the file happens to lie
        ran = dt.datetime.fromtimestamp(args.junit.stat().st_mtime, dt.timezone.utc)
        when = ran.strftime("%Y-%m-%d %H:%M UTC") + " (junit XML of an earlier pytest run)"
    total = sum(float(x[2]) for x in results.values())
    note = (f"{when}; {len(results)} test cases, {total:.0f} s of test time in {wall_seconds(junit):.0f} s; "
            f"Python {platform.python_version()}, "
            f"{platform.machine()}, {_cpu_count()} CPUs, CUDA {'yes' if _cuda() else 'no'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(results, note, args.soak))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if "**fail**" not in args.out.read_text() else 1


def _cpu_count() -> int:
    import os

    return os.cpu_count() or 0


def _cuda() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001 - a machine without torch has no CUDA either
        return False


if __name__ == "__main__":
    sys.exit(main())
