"""TensorBoard over one job's event files, served by the student's own
Jupyter server (docs/ml.md "TensorBoard").

Each board is TensorBoard's own WSGI application over the job's directory,
made in the server's process (it runs as the student, so it reads only
what the student may read) and reached only through the server's
authenticated route ``<server>/delegate/tensorboard/<job id>/``
(delegate._jupyter). No TCP port is opened: on a user node shared by every
student's server, a port would be reachable by every other student, and a
generic proxy to local ports would hand the visitor's cookies to whoever
listens there.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Any

from delegate import _core

#: The route below a Jupyter server's base URL (the core's, which the CLI
#: prints too).
ROUTE = _core.TENSORBOARD_ROUTE
#: At most this many boards per server (the least recently used goes).
MAX_BOARDS = 8
#: How often a board looks for new events (seconds): a running job's curve
#: grows while the page is open.
RELOAD_SECS = 2


def _job_id(job: Any) -> str:
    return job.job_id if hasattr(job, "job_id") else str(job)


def checked_job_dir(job: Any) -> str:
    """The directory of one of the caller's own cluster jobs (delegate-
    client's ``own_job_dir``: a job of the caller's root whose directory is
    a directory of the caller's own). Raises ``NoSuchJobError`` for any
    other."""
    return _core.own_job_dir(_job_id(job))


def url(job: Any, service_prefix: str | None = None) -> str:
    """The board's address below the hub (``/user/<name>/delegate/
    tensorboard/<id>/``). ``service_prefix``: the server's base URL
    (default: ``JUPYTERHUB_SERVICE_PREFIX``, which JupyterHub gives every
    student's server and its terminals and kernels)."""
    prefix = service_prefix or os.environ.get("JUPYTERHUB_SERVICE_PREFIX")
    if not prefix:
        raise RuntimeError(
            "TensorBoard is served by your JupyterHub server, and this process is not "
            "one of its kernels or terminals (JUPYTERHUB_SERVICE_PREFIX is not set)"
        )
    job_id = _job_id(job)
    checked_job_dir(job_id)
    return f"{prefix.rstrip('/')}/{ROUTE}/{job_id}/"


class Board:
    """A link to a job's board (a notebook shows it as one)."""

    def __init__(self, job: Any) -> None:
        self.job_id = _job_id(job)
        self.url = url(self.job_id)

    def __repr__(self) -> str:
        return f"TensorBoard of job {self.job_id}: {self.url}"

    def _repr_html_(self) -> str:
        return f'<a href="{self.url}" target="_blank">TensorBoard of job {self.job_id}</a>'


def tensorboard(job: Any) -> Board:
    """TensorBoard of one of your jobs (an id or a future), running or
    finished: its event files anywhere in the job's directory (``/job`` in
    the sandbox: e.g. ``SummaryWriter("/job/runs")``). In a notebook, the
    link opens it; the curves grow while the job runs."""
    return Board(job)


class Boards:
    """The boards of one server: TensorBoard's WSGI app per job, made on
    first use, at most MAX_BOARDS."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._apps: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def app(self, job_id: str):
        """The WSGI app of ``job_id``'s board (``NoSuchJobError`` for a job
        the server's user does not have)."""
        with self._lock:
            if job_id in self._apps:
                self._apps.move_to_end(job_id)
                return self._apps[job_id]
        logdir = checked_job_dir(job_id)
        made = _make_app(logdir, f"{self.base_url}/{ROUTE}/{job_id}")
        with self._lock:
            app = self._apps.setdefault(job_id, made)
            while len(self._apps) > MAX_BOARDS:
                self._apps.popitem(last=False)
        return app


def _make_app(logdir: str, path_prefix: str):
    """TensorBoard's WSGI application over ``logdir``, answering below
    ``path_prefix`` (TensorBoard's own program, without its server)."""
    from tensorboard import default, program  # type: ignore[import-untyped]
    from tensorboard.backend import application  # type: ignore[import-untyped]

    tb = program.TensorBoard(plugins=default.get_plugins())
    tb.configure(
        argv=[
            "tensorboard",
            "--logdir",
            logdir,
            "--path_prefix",
            path_prefix,
            "--reload_interval",
            str(RELOAD_SECS),
            "--load_fast",
            "false",
        ]
    )
    data_provider, multiplexer = tb._make_data_provider()
    app = application.TensorBoardWSGIApp(
        tb.flags, tb.plugin_loaders, data_provider, tb.assets_zip_provider, multiplexer
    )
    return _fonts_below(app, path_prefix)


def call_wsgi(app, environ: dict) -> tuple[str, list[tuple[str, str]], bytes]:
    """Runs a WSGI app on ``environ``: its status, headers and body."""
    answer: dict[str, Any] = {}
    chunks: list[bytes] = []

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, headers
        return chunks.append

    body = app(environ, start_response)
    try:
        chunks.extend(body)
    finally:
        if hasattr(body, "close"):
            body.close()
    return answer["status"], answer["headers"], b"".join(chunks)


#: The board page's first script (served at ``<board>/delegate-xsrf.js``):
#: TensorBoard's own fetches carry no XSRF token, and the student's server
#: refuses a cookie-authenticated fetch without one (JupyterHub's check
#: that a page served at the hub's address cannot read another student's
#: server). It adds the server's own token, read at each request (a new
#: login renews it) from the ``_xsrf`` cookie
#: that only pages below the student's server can read, to every request
#: of the page to the board's own URLs. It holds no secret: a page
#: elsewhere that loads it reads no cookie of the student's server.
XSRF_SCRIPT = b"""(function () {
  function token() {
    var m = document.cookie.match(/(?:^|;\\s*)_xsrf=([^;]*)/);
    return m ? decodeURIComponent(m[1]) : "";
  }
  var board = location.pathname.replace(/[^/]*$/, "");
  function mine(url) {
    try {
      var u = new URL(url, location.href);
      return u.origin === location.origin && u.pathname.indexOf(board) === 0;
    } catch (e) {
      return false;
    }
  }
  var fetch0 = window.fetch;
  window.fetch = function (input, init) {
    var url = typeof input === "string" || input instanceof URL ? String(input) : input && input.url;
    if (mine(url)) {
      init = Object.assign({}, init);
      var h = new Headers(init.headers || (input instanceof Request ? input.headers : undefined));
      h.set("X-XSRFToken", token());
      init.headers = h;
    }
    return fetch0.call(this, input, init);
  };
  var open0 = XMLHttpRequest.prototype.open, send0 = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url) {
    this.delegateBoard = mine(url);
    return open0.apply(this, arguments);
  };
  XMLHttpRequest.prototype.send = function () {
    if (this.delegateBoard) this.setRequestHeader("X-XSRFToken", token());
    return send0.apply(this, arguments);
  };
})();
"""
XSRF_SCRIPT_NAME = "delegate-xsrf.js"


def _fonts_below(app, path_prefix: str):
    """TensorBoard's page, rewritten; every other answer passes unchanged.

    - Its fonts: the page names them from the server's root
      (``url(/font-roboto/...)``, 70 of them), which ``--path_prefix``
      leaves as they are: below a hub the browser would ask the hub for them
      (404, and the page falls back to another font). They are named below
      ``path_prefix``, where the app serves them.
    - Its first script is :data:`XSRF_SCRIPT`, served here."""
    root, below = b"url(/font-roboto/", f"url({path_prefix}/font-roboto/".encode()
    doctype = b"<!doctype html>"
    first = doctype + f'<script src="{XSRF_SCRIPT_NAME}"></script>'.encode()

    def serve(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == f"{path_prefix}/{XSRF_SCRIPT_NAME}":
            start_response(
                "200 OK",
                [
                    ("Content-Type", "text/javascript; charset=utf-8"),
                    ("Content-Length", str(len(XSRF_SCRIPT))),
                    ("Cache-Control", "no-cache"),
                    ("X-Content-Type-Options", "nosniff"),
                ],
            )
            return [XSRF_SCRIPT]
        if path not in (path_prefix + "/", path_prefix + "/index.html"):
            return app(environ, start_response)
        # (uncompressed, to be rewritten)
        status, headers, page = call_wsgi(app, dict(environ, HTTP_ACCEPT_ENCODING="identity"))
        page = page.replace(root, below)
        if page.lower().startswith(doctype):
            page = first + page[len(doctype) :]
        start_response(
            status, [(k, str(len(page)) if k.lower() == "content-length" else v) for k, v in headers]
        )
        return [page]

    return serve
