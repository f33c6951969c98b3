"""Prints "PASSED FAILED" from a pytest JUnit report, for the run.sh scripts' closing line: an error, a skip
or a missing report is no pass.

    python tests/support/junit_counts.py REPORT.xml
"""

import sys
import xml.etree.ElementTree as ElementTree


def counts(path: str) -> tuple[int, int]:
    try:
        suites = ElementTree.parse(path).getroot().iter("testsuite")
    except (OSError, ElementTree.ParseError):
        return 0, 0
    total = not_passed = 0
    for suite in suites:
        total += int(suite.get("tests", 0))
        not_passed += sum(int(suite.get(key, 0)) for key in ("failures", "errors", "skipped"))
    return total - not_passed, not_passed


if __name__ == "__main__":
    print(*counts(sys.argv[1]))
