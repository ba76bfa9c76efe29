"""delegate's pages in the student's own Jupyter server: a jupyter_server
extension (the user image enables it) that serves each job's TensorBoard
at ``<base url>delegate/tensorboard/<job id>/`` (delegate._tensorboard).

The route is the server's own: JupyterHub lets only the server's student
reach it (the server's authentication, ``tornado.web.authenticated``), and
the board runs in the server's process, as that student. Requests for its
data are checked for the server's XSRF token like any other (a fetch from
a page that is not the board's gets no answer); the board's page sends it
(delegate._tensorboard.XSRF_SCRIPT).
"""

from __future__ import annotations

import asyncio
import io

import tornado.web
import tornado.wsgi
from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join

from delegate._errors import NoSuchJobError
from delegate._tensorboard import ROUTE, Boards, call_wsgi

#: A job id as delegate makes them (protocol/src/job_id.rs).
JOB_ID = r"(\d{8}T\d{6}-[0-9a-f]{8})"
#: Response headers that belong to one connection, not to the answer.
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "upgrade"}


class TensorBoardHandler(JupyterHandler):
    """One job's board: TensorBoard's app answers every path below it."""

    def initialize(self, boards: Boards) -> None:
        self.boards = boards

    def check_xsrf_cookie(self) -> None:
        """The server's own check (JupyterHub's, for a cookie-authenticated
        request that is not a page navigation) for the board's data and for
        every request but a GET; a GET of TensorBoard's own files (its
        page, scripts, icons, fonts: the same for every board) is not
        checked: the page's fonts are fetched by the browser's CSS in cors
        mode, which no script can give a token to."""
        if self.request.method == "GET" and not _is_data(
            self.path_args[1] if len(self.path_args) > 1 else ""
        ):
            return None
        return super().check_xsrf_cookie()

    @tornado.web.authenticated
    async def get(self, job_id: str, _path: str) -> None:
        await self._serve(job_id)

    @tornado.web.authenticated
    async def post(self, job_id: str, _path: str) -> None:
        await self._serve(job_id)

    async def _serve(self, job_id: str) -> None:
        # The server's XSRF cookie, set now if the student has none yet:
        # the board's page reads it and sends it with each of its requests
        # (delegate._tensorboard.XSRF_SCRIPT), which the server checks as it
        # does for every cookie-authenticated fetch (no exemption here).
        _ = self.xsrf_token
        loop = asyncio.get_running_loop()
        try:
            app = await loop.run_in_executor(None, self.boards.app, job_id)
        except NoSuchJobError as e:
            self.log.warning("delegate: no TensorBoard of job %s here: %s", job_id, e)
            raise tornado.web.HTTPError(404, reason=f"no job {job_id} of yours") from e
        environ = tornado.wsgi.WSGIContainer(app).environ(self.request)
        environ["wsgi.input"] = io.BytesIO(self.request.body or b"")
        status, headers, body = await loop.run_in_executor(None, call_wsgi, app, environ)
        code, _, reason = status.partition(" ")
        self.set_status(int(code), reason or None)
        for name, value in headers:
            if name.lower() not in HOP_BY_HOP:
                self.add_header(name, value) if name.lower() == "set-cookie" else self.set_header(name, value)
        self.finish(body)


def _is_data(path: str) -> bool:
    """Whether a path below a board is checked as its data: ``data/...``,
    ``experiment/<id>/...`` (what the job's event files say) and the page
    itself (a fetch of it is no navigation)."""
    parts = path.split("/")
    return "data" in parts or not path or path.startswith(("experiment/", "data"))


class AddSlashHandler(JupyterHandler):
    """``.../tensorboard/<id>`` to ``.../tensorboard/<id>/`` (the board's
    relative links need the slash)."""

    @tornado.web.authenticated
    def get(self, _job_id: str) -> None:
        self.redirect(self.request.path + "/")


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "delegate._jupyter"}]


def _load_jupyter_server_extension(serverapp) -> None:
    web_app = serverapp.web_app
    base = web_app.settings["base_url"]
    boards = Boards(base)
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, ROUTE, JOB_ID, "(.*)"), TensorBoardHandler, {"boards": boards}),
            (url_path_join(base, ROUTE, JOB_ID), AddSlashHandler),
        ],
    )
    serverapp.log.info("delegate: TensorBoard of each job at %s", url_path_join(base, ROUTE, "<job id>/"))
