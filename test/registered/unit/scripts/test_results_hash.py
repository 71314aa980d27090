"""docs/results.md: every section ran on the current series.

Each ``## `` section names its date, machine and the series it ran on, and
gives its command and its table (the page's head says how). A section whose
series hash is not the one ``scripts/series.py`` computes for ``patches/``
now is stale: rerun its command and replace the section, or delete it.
"""

import re
import sys
from pathlib import Path

import pytest

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="stage-a-test-cpu")

ROOT = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(ROOT / "scripts"))

import series  # noqa: E402

pytestmark = pytest.mark.control(
    reason="checks this repository's results page against its series, not the series' behaviour"
)

RESULTS = ROOT / "docs" / "results.md"
_FIELD = re.compile(r"^- \*\*(Date|Machine|Series):\*\* (.+)$", re.M)
_HASH = re.compile(r"`?([0-9a-f]{12,64})`?")


def sections(text):
    """(title, body) of each ``## `` section."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return list(zip(parts[1::2], parts[2::2]))


def problems(text, current):
    """One line per section that lacks a field, a command or a table, or
    that ran on another series than ``current``."""
    out = []
    for title, body in sections(text):
        where = f"docs/results.md section {title!r}"
        fields = dict(_FIELD.findall(body))
        missing = [f for f in ("Date", "Machine", "Series") if f not in fields]
        if missing:
            out.append(f"{where}: no {', '.join(missing)} line")
            continue
        if not re.match(r"\d{4}-\d{2}-\d{2}\b", fields["Date"]):
            out.append(f"{where}: the Date line has no YYYY-MM-DD date")
        if "```bash\n" not in body:
            out.append(f"{where}: no ```bash block with its command")
        if not re.search(r"^\|.*\|\s*$", body, re.M):
            out.append(f"{where}: no table")
        m = _HASH.fullmatch(fields["Series"].strip())
        if not m:
            out.append(f"{where}: the Series line is not a series hash")
        elif not current.startswith(m.group(1)):
            out.append(
                f"{where} ran on series {m.group(1)}, the current series is "
                f"{current[:12]}: rerun its command and replace the section"
            )
    return out


def test_every_section_of_results_ran_on_the_current_series():
    current = series.load_series(ROOT / "patches").hash
    text = RESULTS.read_text(encoding="utf-8")
    assert sections(text), "docs/results.md has no section"
    found = problems(text, current)
    assert not found, "\n".join(found)


def test_a_stale_or_incomplete_section_is_named_with_both_hashes():
    text = (
        "## Stale\n\n- **Date:** 2026-01-01\n- **Machine:** m\n"
        "- **Series:** `0123456789ab`\n\n```bash\nmake demo\n```\n\n"
        "| a |\n|---|\n| 1 |\n\n"
        "## Bare\n\nA figure, no fields.\n\n"
        "## No command\n\n- **Date:** 2026-01-01\n- **Machine:** m\n"
        "- **Series:** `ffffffffffff`\n\n| a |\n|---|\n"
    )
    assert problems(text, "f" * 64) == [
        "docs/results.md section 'Stale' ran on series 0123456789ab, the current "
        "series is ffffffffffff: rerun its command and replace the section",
        "docs/results.md section 'Bare': no Date, Machine, Series line",
        "docs/results.md section 'No command': no ```bash block with its command",
    ]
