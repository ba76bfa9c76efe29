"""The instructor's page of the rush: a JupyterHub service on the user node
(/services/rush/), for the hub's admins only (the roster's instructors and
the admin group; JupyterHub's OAuth refuses everyone else, students
included, before this code runs: its admin role alone holds
`access:services`).

Every few seconds it asks `delegate admin rush --json` (one squeue and one
sinfo; every USAGE_EVERY seconds also sacct for the heaviest users) as root
on the user node, keeps the last hour of samples in memory, and serves the
page, whose script fetches `data` again every few seconds and draws the
plots. Numbers come from the Rust command alone (the same as its text
form); this file samples, keeps and renders. Nothing a request carries
reaches a command.

Run by the hub (stack/jupyterhub_config.py, `c.JupyterHub.services`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import time

DELEGATE = os.environ.get("DELEGATE_BIN", "delegate")
EVERY = float(os.environ.get("DELEGATE_RUSH_EVERY", "5"))
USAGE_EVERY = 30.0
SINCE = "now-3hours"
# SINCE as the page says it.
SINCE_WORDS = "the last 3 hours"
KEEP = int(3600 / EVERY)
COMMAND_TIMEOUT = 60.0
MAX_OUTPUT = 4 << 20


class Sampler:
    """The samples of the rush: the latest snapshot, its heaviest users
    (from the last sample that asked the accounting) and the history of
    the counts (at most KEEP, oldest first)."""

    def __init__(self, command=None, clock=time.time):
        self.command = command or run_rush
        self.clock = clock
        self.history: collections.deque = collections.deque(maxlen=KEEP)
        self.latest: dict | None = None
        self.heaviest: list | None = None
        self.error: str | None = None
        self.usage_at = float("-inf")

    async def sample(self) -> None:
        now = self.clock()
        with_usage = now - self.usage_at >= USAGE_EVERY
        try:
            snap = await self.command(SINCE if with_usage else None)
        except Exception as e:  # noqa: BLE001 (any failure is shown, the loop goes on)
            self.error = f"{type(e).__name__}: {e}"[:400]
            return
        self.error = None
        if with_usage and snap.get("heaviest") is not None:
            self.heaviest = snap["heaviest"]
            self.usage_at = now
        self.latest = snap
        self.history.append(
            {k: snap.get(k, 0) for k in ("at", "running", "pending", "busy", "free", "wait_p90_secs")}
            | {"out": len(snap.get("out", []))}
        )

    def data(self) -> dict:
        return {
            "latest": self.latest,
            "heaviest": self.heaviest,
            "since": SINCE_WORDS,
            "history": list(self.history),
            "error": self.error,
            "every": EVERY,
        }


async def run_rush(since: str | None) -> dict:
    """`delegate --json admin rush [--since SINCE]`, bounded in time and size."""
    args = [DELEGATE, "--json", "admin", "rush"] + (["--since", since] if since else [])
    proc = await asyncio.create_subprocess_exec(
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        limit=MAX_OUTPUT,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), COMMAND_TIMEOUT)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"delegate admin rush did not answer within {COMMAND_TIMEOUT:.0f} s") from None
    if proc.returncode != 0:
        first = (err.decode(errors="replace").strip().splitlines() or ["(no message)"])[-1]
        raise RuntimeError(f"delegate admin rush failed (exit {proc.returncode}): {first}")
    if len(out) > MAX_OUTPUT:
        raise RuntimeError("delegate admin rush printed more than the page reads")
    return json.loads(out)


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>The rush: delegate</title>
<style>
body { font: 15px system-ui, sans-serif; margin: 1.5em 2em; color: #222; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.2em 0 .4em; }
.facts { display: flex; gap: 1.2em; flex-wrap: wrap; }
.fact { border: 1px solid #ccc; border-radius: 6px; padding: .5em .9em; min-width: 8em; }
.fact b { display: block; font-size: 1.6em; }
.plots { display: flex; gap: 2em; flex-wrap: wrap; }
svg { border: 1px solid #ddd; background: #fafafa; }
table { border-collapse: collapse; } td, th { padding: .2em .8em; text-align: left; border-bottom: 1px solid #eee; }
.muted { color: #777; } .error { color: #b00; }
</style></head>
<body>
<h1>The rush</h1>
<div class="muted" id="updated">waiting for the first sample</div>
<div class="error" id="error"></div>
<div class="facts">
 <div class="fact" id="f-running"><b>-</b>calls running</div>
 <div class="fact" id="f-pending"><b>-</b>calls waiting</div>
 <div class="fact" id="f-students"><b>-</b>students waiting</div>
 <div class="fact" id="f-busy"><b>-</b>nodes busy</div>
 <div class="fact" id="f-out"><b>-</b>nodes out</div>
 <div class="fact" id="f-waits"><b>-</b>waits now: median / 90% / longest</div>
</div>
<div class="plots">
 <div><h2>Calls running and waiting</h2><svg id="p-queue" width="460" height="180"></svg></div>
 <div><h2>Nodes busy and out</h2><svg id="p-nodes" width="460" height="180"></svg></div>
</div>
<h2>Nodes out, and why</h2><table id="t-out"><tr><td class="muted">none</td></tr></table>
<h2>Students waiting longest</h2><table id="t-waits"><tr><td class="muted">no one waits</td></tr></table>
<h2 id="h-heavy">Heaviest users by node time</h2><table id="t-heavy"><tr><td class="muted">not read yet</td></tr></table>
<script>
function hms(s) { s = Math.round(s); const h = Math.floor(s / 3600), m = Math.floor(s / 60) % 60;
  return (h ? h + ":" + String(m).padStart(2, "0") : m) + ":" + String(s % 60).padStart(2, "0"); }
function fact(id, v) { document.querySelector("#" + id + " b").textContent = v; }
function cell(tr, text) { const td = document.createElement("td"); td.textContent = text; tr.appendChild(td); }
function table(id, head, rows, empty) {
  const t = document.getElementById(id); t.replaceChildren();
  if (!rows.length) { const tr = t.insertRow(); cell(tr, empty); tr.className = "muted"; return; }
  const h = t.insertRow(); head.forEach(x => { const th = document.createElement("th"); th.textContent = x; h.appendChild(th); });
  rows.forEach(r => { const tr = t.insertRow(); r.forEach(x => cell(tr, x)); });
}
function plot(id, hist, series) {
  const svg = document.getElementById(id), W = +svg.getAttribute("width"), H = +svg.getAttribute("height");
  const NS = "http://www.w3.org/2000/svg"; svg.replaceChildren();
  if (hist.length < 1) return;
  const t0 = hist[0].at, t1 = Math.max(hist[hist.length - 1].at, t0 + 60);
  const top = Math.max(1, ...hist.flatMap(p => series.map(s => p[s.key])));
  const x = t => 40 + (W - 50) * (t - t0) / (t1 - t0), y = v => H - 20 - (H - 35) * v / top;
  const text = (tx, ty, s, anchor) => { const e = document.createElementNS(NS, "text"); e.setAttribute("x", tx);
    e.setAttribute("y", ty); e.setAttribute("font-size", "11"); e.setAttribute("text-anchor", anchor || "start"); e.textContent = s; svg.appendChild(e); return e; };
  text(35, y(top) + 4, String(top), "end"); text(35, y(0) + 4, "0", "end");
  text(40, H - 4, "-" + hms(t1 - t0)); text(W - 10, H - 4, "now", "end");
  series.forEach((s, i) => {
    const pl = document.createElementNS(NS, "polyline");
    pl.setAttribute("points", hist.map(p => x(p.at) + "," + y(p[s.key])).join(" "));
    pl.setAttribute("fill", "none"); pl.setAttribute("stroke", s.color); pl.setAttribute("stroke-width", "2");
    pl.setAttribute("data-series", s.key); svg.appendChild(pl);
    text(50 + i * 110, 12, "\u25a0 " + s.label).setAttribute("fill", s.color);
  });
}
async function refresh() {
  try {
    // (a fetch is not a page view: the hub's cookie counts only with the
    // page's XSRF token, as JupyterHub 4.1+ checks it)
    const r = await fetch("data", {credentials: "same-origin", cache: "no-store", headers: {"X-XSRFToken": XSRF}});
    if (!r.ok) throw new Error("the page's data: HTTP " + r.status);
    const d = await r.json(), s = d.latest;
    document.getElementById("error").textContent = d.error ? "last sample failed: " + d.error : "";
    if (s) {
      document.getElementById("updated").textContent = "as of " + new Date(s.at * 1000).toLocaleTimeString() +
        " (every " + d.every + " s, from Slurm on the manager)";
      fact("f-running", s.running); fact("f-pending", s.pending); fact("f-students", s.students_waiting);
      fact("f-busy", s.busy + " of " + s.nodes); fact("f-out", s.out.length);
      fact("f-waits", hms(s.wait_p50_secs) + " / " + hms(s.wait_p90_secs) + " / " + hms(s.wait_max_secs));
      table("t-out", ["node", "state", "why"], s.out.map(n => [n.node, n.state, n.reason]), "none: every node is usable");
      table("t-waits", ["student", "calls waiting", "oldest waiting for"],
        s.longest_waits.map(w => [w.user, w.pending, hms(w.longest_secs)]), "no one waits");
    }
    if (d.heaviest) {
      document.getElementById("h-heavy").textContent = "Heaviest users by node time (" + d.since + ")";
      table("t-heavy", ["student", "node time", "allocations"], d.heaviest.map(h => [h.user, hms(h.node_secs), h.allocations]), "no node time yet");
    }
    plot("p-queue", d.history, [{key: "running", label: "running", color: "#2a7"}, {key: "pending", label: "waiting", color: "#d62"}]);
    plot("p-nodes", d.history, [{key: "busy", label: "busy", color: "#27c"}, {key: "out", label: "out", color: "#b00"}]);
  } catch (e) { document.getElementById("error").textContent = String(e); }
}
const XSRF = XSRF_TOKEN;
refresh(); setInterval(refresh, EVERY_MS);
</script></body></html>
"""


def page(xsrf: str) -> str:
    """The page, with the refresh interval and the XSRF token its fetches
    carry (a JSON string: the token's characters cannot end the script)."""
    return PAGE.replace("EVERY_MS", str(int(EVERY * 1000))).replace(
        "XSRF_TOKEN", json.dumps(xsrf).replace("<", "\\u003c")
    )


def make_app(sampler: Sampler, prefix: str):
    from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
    from tornado import web

    class Page(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self):
            self.set_header("Content-Type", "text/html; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            self.set_header(
                "Content-Security-Policy",
                "default-src 'self'; script-src 'unsafe-inline' 'self'; style-src 'unsafe-inline'",
            )
            self.write(page(self.xsrf_token.decode()))

    class Data(HubOAuthenticated, web.RequestHandler):
        @web.authenticated
        def get(self):
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(json.dumps(sampler.data()))

    return web.Application(
        [
            (prefix, Page),
            (prefix + "data", Data),
            (prefix + "oauth_callback", HubOAuthCallbackHandler),
        ],
        cookie_secret=os.urandom(32),
    )


async def main() -> None:
    from urllib.parse import urlparse

    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    sampler = Sampler()
    app = make_app(sampler, prefix)
    app.listen(url.port, url.hostname)
    while True:
        await sampler.sample()
        await asyncio.sleep(EVERY)


if __name__ == "__main__":
    asyncio.run(main())
