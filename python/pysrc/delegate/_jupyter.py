"""delegate's pages in the student's own Jupyter server: a jupyter_server
extension (the user image enables it) that serves each job's TensorBoard
at ``<base url>delegate/tensorboard/<job id>/`` (delegate._tensorboard).

The route is the server's own: JupyterHub lets only the server's student
reach it (the server's authentication, ``tornado.web.authenticated``), and
the board runs in the server's process, as that student.
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
        """No XSRF token: TensorBoard's page fetches and posts its data
        queries without Jupyter's, and JupyterHub refuses a cookie-signed
        fetch whose check fails (the page would get the login page as
        data). Nothing below this route changes anything: every request
        reads the job's event files, and another site's page cannot read
        the answers (no CORS)."""
        return

    @tornado.web.authenticated
    async def get(self, job_id: str, _path: str) -> None:
        await self._serve(job_id)

    @tornado.web.authenticated
    async def post(self, job_id: str, _path: str) -> None:
        await self._serve(job_id)

    async def _serve(self, job_id: str) -> None:
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
