"""The test harness's account logic (tests/testlib.py), against fake account
databases: no Slurm, no Docker, no account is read or written. Run by
tests/run.sh (stage 2), the fast tier."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import testlib


def pw(name, uid):
    return SimpleNamespace(pw_name=name, pw_uid=uid, pw_gid=uid)


def gr(name, gid):
    return SimpleNamespace(gr_name=name, gr_gid=gid)


SYSTEM = [pw("root", 0), pw("daemon", 1), pw("nobody", 65534)]
SYSTEM_GROUPS = [gr("root", 0), gr("nogroup", 65534)]


def test_fresh_machine_gets_the_usual_ids():
    assert testlib.plan_user("delegate-alice", SYSTEM, SYSTEM_GROUPS) == ("create", 2001)
    assert testlib.plan_user("delegate-bob", SYSTEM, SYSTEM_GROUPS, prefer=2002) == ("create", 2002)


def test_a_taken_uid_or_gid_is_skipped():
    # The machine of the bug report: a real user holds 2001, a group holds 2002.
    passwd = [*SYSTEM, pw("carol", 2001)]
    groups = [*SYSTEM_GROUPS, gr("carol", 2001), gr("lab", 2002)]
    assert testlib.plan_user("delegate-alice", passwd, groups) == ("create", 2003)


def test_an_existing_test_account_is_reused_as_it_is():
    passwd = [*SYSTEM, pw("delegate-alice", 1234), pw("carol", 2001)]
    assert testlib.plan_user("delegate-alice", passwd, SYSTEM_GROUPS) == ("reuse", 1234)


def test_never_a_system_account_or_a_foreign_name():
    with pytest.raises(RuntimeError, match="system uid"):
        testlib.plan_user("delegate-alice", [*SYSTEM, pw("delegate-alice", 0)], SYSTEM_GROUPS)
    with pytest.raises(ValueError, match="not a test account"):
        testlib.plan_user("carol", SYSTEM, SYSTEM_GROUPS)


def test_free_id_wraps_around_and_stays_in_range():
    assert testlib.free_id({5, 6}, prefer=5, id_range=(1, 10)) == 7
    assert testlib.free_id({8, 9}, prefer=8, id_range=(1, 10)) == 1
    assert testlib.free_id(set(), prefer=0, id_range=(1000, 60000)) == 1000
    assert testlib.free_id(set(), prefer=99999, id_range=(1000, 60000)) == 1000
    with pytest.raises(RuntimeError, match="no free"):
        testlib.free_id(range(1, 10), prefer=1, id_range=(1, 10))


class FakeAccounts:
    """pwd, grp and useradd over in-memory lists. `steal` lists uids that
    another process takes just before our useradd (exit 4, as useradd does)."""

    def __init__(self, passwd, groups, steal=()):
        self.passwd, self.groups, self.steal, self.calls = list(passwd), list(groups), set(steal), []
        self.associated = []

    def getpwnam(self, name):
        for p in self.passwd:
            if p.pw_name == name:
                return p
        raise KeyError(name)

    def getgrnam(self, name):
        for g in self.groups:
            if g.gr_name == name:
                return g
        raise KeyError(name)

    def useradd(self, cmd, **_kw):
        self.calls.append(cmd)
        name, uid = cmd[-1], int(cmd[cmd.index("--uid") + 1])
        if uid in self.steal:
            self.steal.discard(uid)
            self.passwd.append(pw("intruder%d" % uid, uid))
            return SimpleNamespace(returncode=4, stderr="useradd: UID %d is not unique" % uid)
        assert name not in {p.pw_name for p in self.passwd}
        self.passwd.append(pw(name, uid))
        if "--user-group" in cmd:
            self.groups.append(gr(name, uid))
        return SimpleNamespace(returncode=0, stderr="")


@pytest.fixture
def fake(monkeypatch):
    def install(passwd, groups, steal=()):
        f = FakeAccounts(passwd, groups, steal)
        monkeypatch.setattr(testlib.pwd, "getpwall", lambda: list(f.passwd))
        monkeypatch.setattr(testlib.pwd, "getpwnam", f.getpwnam)
        monkeypatch.setattr(testlib.grp, "getgrall", lambda: list(f.groups))
        monkeypatch.setattr(testlib.grp, "getgrnam", f.getgrnam)
        monkeypatch.setattr(testlib.subprocess, "run", f.useradd)
        monkeypatch.setattr(testlib, "ensure_association", lambda name, *a, **k: f.associated.append(name))
        return f

    return install


def test_ensure_users_around_real_accounts(fake):
    # carol holds 2001 and bob's account already exists: alice gets the next
    # free id, bob is reused untouched, carol is never named in a command.
    f = fake([*SYSTEM, pw("carol", 2001), pw("delegate-bob", 2002)], [*SYSTEM_GROUPS, gr("carol", 2001)])
    testlib.ensure_users()
    assert f.getpwnam("delegate-alice").pw_uid == 2003
    assert f.getpwnam("delegate-bob").pw_uid == 2002
    assert f.getpwnam("carol").pw_uid == 2001
    assert len(f.calls) == 1 and f.calls[0][-1] == "delegate-alice"
    # Both students, created or reused, get their Slurm association.
    assert f.associated == ["delegate-alice", "delegate-bob"]


def test_ensure_user_retries_when_the_uid_is_taken_meanwhile(fake):
    f = fake(SYSTEM, SYSTEM_GROUPS, steal={2001})
    assert testlib.ensure_user("delegate-alice").pw_uid == 2002
    assert [c[c.index("--uid") + 1] for c in f.calls] == ["2001", "2002"]


def test_a_leftover_group_of_the_name_is_joined(fake):
    f = fake(SYSTEM, [*SYSTEM_GROUPS, gr("delegate-alice", 2001)])
    assert testlib.ensure_user("delegate-alice").pw_uid == 2002
    assert "--gid" in f.calls[0] and "--user-group" not in f.calls[0]
