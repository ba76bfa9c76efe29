"""Helpers of the test site's suite (tests/site/): commands as a user on a node."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

HOME = "/srv/delegate-site/home"


@dataclass
class Shell:
    """Commands as one user on one of the site's nodes (ctl: the login node)."""

    user: str
    node: str = "ctl"

    def run(self, *cmd: str, timeout: float = 180, check: bool = False) -> subprocess.CompletedProcess:
        home = "/root" if self.user == "root" else f"{HOME}/{self.user}"
        argv = [
            "docker",
            "exec",
            "-u",
            self.user,
            "-w",
            home,
            "-e",
            f"HOME={home}",
            f"site-{self.node}",
            *cmd,
        ]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        if check and r.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} as {self.user} on {self.node}: rc={r.returncode}\n{r.stdout}{r.stderr}"
            )
        return r
