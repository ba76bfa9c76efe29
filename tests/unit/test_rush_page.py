"""The instructor's page's sampler (stack/rush_page.py), without a hub: it
asks the accounting at most every USAGE_EVERY seconds, keeps its history
bounded, shows a failed sample's reason and keeps the last good one. The
page itself, with the real `delegate admin rush` behind it, is tried in
the browser by the acceptance day (tests/acceptance, test 4)."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("rush_page", REPO / "stack" / "rush_page.py")
rush_page = importlib.util.module_from_spec(spec)
spec.loader.exec_module(rush_page)


def snapshot(at: int, heaviest=None) -> dict:
    return {
        "at": at,
        "running": 2,
        "pending": 5,
        "students_waiting": 3,
        "nodes": 2,
        "busy": 2,
        "free": 0,
        "out": [{"node": "worker3", "state": "down*", "reason": "Not responding"}],
        "wait_p50_secs": 10,
        "wait_p90_secs": 50,
        "wait_max_secs": 60,
        "longest_waits": [],
        "heaviest": heaviest,
    }


def test_the_sampler_asks_the_accounting_rarely_and_keeps_a_bounded_history():
    asked = []
    now = [1000.0]
    fail = [False]

    async def command(since):
        asked.append(since)
        if fail[0]:
            raise RuntimeError("delegate admin rush failed (exit 1): slurm_load_jobs error")
        return snapshot(int(now[0]), [{"user": "ben", "node_secs": 60, "allocations": 1}] if since else None)

    s = rush_page.Sampler(command=command, clock=lambda: now[0])
    for _ in range(rush_page.KEEP + 20):
        asyncio.run(s.sample())
        now[0] += rush_page.EVERY
    with_usage = [a for a in asked if a]
    assert with_usage and all(a == rush_page.SINCE for a in with_usage)
    # every USAGE_EVERY seconds, not every sample
    assert len(with_usage) <= len(asked) * rush_page.EVERY / rush_page.USAGE_EVERY + 1
    d = s.data()
    assert len(d["history"]) == rush_page.KEEP
    assert d["history"][-1] == {
        "at": int(now[0] - rush_page.EVERY),
        "running": 2,
        "pending": 5,
        "busy": 2,
        "free": 0,
        "wait_p90_secs": 50,
        "out": 1,
    }
    assert d["heaviest"] == [{"user": "ben", "node_secs": 60, "allocations": 1}]
    # The page says the window in words, not sacct's `now-3hours`.
    assert d["since"] == "the last 3 hours"
    # A failed sample is shown; the last good one stays.
    fail[0] = True
    asyncio.run(s.sample())
    d = s.data()
    assert d["error"] == "RuntimeError: delegate admin rush failed (exit 1): slurm_load_jobs error"
    assert d["latest"]["pending"] == 5 and len(d["history"]) == rush_page.KEEP


def test_the_page_refreshes_at_the_sampling_interval_and_loads_nothing_from_elsewhere():
    html = rush_page.page("2|abc</script>")
    assert f"setInterval(refresh, {int(rush_page.EVERY * 1000)})" in html
    # the fetches carry the XSRF token, which cannot end the script
    assert 'const XSRF = "2|abc\\u003c/script>";' in html and '"X-XSRFToken": XSRF' in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<script src" not in html
    # what a student's name can become on the page: text, never markup
    assert "innerHTML" not in html
