//! The stack's roster state (`$DELEGATE_STACK_DIR/roster`, root only): one
//! account per line, `user uid role full name[,,,email]`, in the order they
//! were added. `accounts add` gives each new roster entry the first free
//! uid from the first roster uid (free of cluster.toml's accounts, the
//! admin group's id and the roster's own), `accounts remove` takes one out,
//! `accounts list` shows them with cluster.toml's. The same roster added
//! twice changes nothing.

use std::fmt::Write as _;
use std::path::Path;

use crate::roster::Entry;

/// One account of the roster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub user: String,
    pub uid: u32,
    pub instructor: bool,
    /// The passwd GECOS field: `full name` or `full name,,,email`.
    pub gecos: String,
}

impl Account {
    fn role(&self) -> &'static str {
        if self.instructor {
            "instructor"
        } else {
            "student"
        }
    }

    /// The full name (GECOS's first field).
    pub fn name(&self) -> &str {
        self.gecos.split(',').next().unwrap_or("")
    }
}

/// An account of cluster.toml (name and uid), which the roster leaves alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserved {
    pub user: String,
    pub uid: u32,
}

impl std::str::FromStr for Reserved {
    type Err = String;

    /// `name:uid`.
    fn from_str(s: &str) -> Result<Reserved, String> {
        let (user, uid) = s.split_once(':').ok_or_else(|| format!("{s:?} is not name:uid"))?;
        let uid = uid.parse().map_err(|_| format!("{s:?}: the uid is not a number"))?;
        if !crate::settings::is_unix_name(user) {
            return Err(format!("{s:?}: not a user name"));
        }
        Ok(Reserved { user: user.to_owned(), uid })
    }
}

/// The roster state.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RosterState {
    pub accounts: Vec<Account>,
}

/// At most this many accounts (a course, not a directory service).
const MAX_ACCOUNTS: usize = crate::roster::MAX_ENTRIES;

impl RosterState {
    /// The state file's text (blank and `#` lines skipped); a line that is
    /// not an account is an error naming it.
    pub fn parse(text: &str) -> Result<RosterState, String> {
        let mut accounts: Vec<Account> = Vec::new();
        for (i, line) in text
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        {
            let bad = |why: &str| format!("roster state line {}: {why}", i + 1);
            let mut f = line.splitn(4, ' ');
            let (user, uid, role) = (f.next().unwrap_or(""), f.next().unwrap_or(""), f.next().unwrap_or(""));
            if !crate::settings::is_unix_name(user) {
                return Err(bad(&format!("{user:?} is not a user name")));
            }
            let uid: u32 = uid.parse().map_err(|_| bad(&format!("uid {uid:?} is not a number")))?;
            let instructor = match role {
                "student" => false,
                "instructor" => true,
                other => return Err(bad(&format!("role {other:?} is neither student nor instructor"))),
            };
            if accounts.iter().any(|a| a.user == user || a.uid == uid) {
                return Err(bad(&format!("{user} (uid {uid}) is there twice")));
            }
            if accounts.len() >= MAX_ACCOUNTS {
                return Err(bad(&format!("more than {MAX_ACCOUNTS} accounts")));
            }
            accounts.push(Account {
                user: user.to_owned(),
                uid,
                instructor,
                gecos: f.next().unwrap_or(user).to_owned(),
            });
        }
        Ok(RosterState { accounts })
    }

    /// The state file's text.
    pub fn render(&self) -> String {
        self.accounts.iter().fold(String::new(), |mut s, a| {
            let _ = writeln!(s, "{} {} {} {}", a.user, a.uid, a.role(), a.gecos);
            s
        })
    }

    /// Adds every entry that is not an account yet (of the roster or of
    /// cluster.toml) with the first free uid from `first_uid`; returns the
    /// accounts added, in the roster's order.
    pub fn add(
        &mut self,
        entries: &[Entry],
        reserved: &[Reserved],
        reserved_ids: &[u32],
        first_uid: u32,
    ) -> Vec<Account> {
        let mut added = Vec::new();
        for e in entries {
            if reserved.iter().any(|r| r.user == e.user) || self.accounts.iter().any(|a| a.user == e.user) {
                continue;
            }
            let taken = |uid: u32| {
                reserved.iter().any(|r| r.uid == uid)
                    || reserved_ids.contains(&uid)
                    || self.accounts.iter().any(|a| a.uid == uid)
            };
            let Some(uid) = (first_uid..=u32::MAX - 1).find(|&u| !taken(u)) else {
                break;
            };
            let name = if e.name.is_empty() {
                e.user.as_str()
            } else {
                e.name.as_str()
            };
            let gecos = if e.email.is_empty() {
                name.to_owned()
            } else {
                format!("{name},,,{}", e.email)
            };
            let a = Account {
                user: e.user.clone(),
                uid,
                instructor: e.instructor,
                gecos,
            };
            self.accounts.push(a.clone());
            added.push(a);
        }
        added
    }

    /// Takes `user` out; an error when it is not a roster account.
    pub fn remove(&mut self, user: &str, reserved: &[Reserved]) -> Result<Account, String> {
        if reserved.iter().any(|r| r.user == user) {
            return Err(format!(
                "{user} is an account of cluster.toml: remove it there (DELEGATE_STACK_USERS) and run update"
            ));
        }
        let i = self
            .accounts
            .iter()
            .position(|a| a.user == user)
            .ok_or_else(|| format!("{user} is not an account of the stack's roster"))?;
        Ok(self.accounts.remove(i))
    }

    /// `accounts list`: every account, cluster.toml's first (`admins` are
    /// its instructors), then the roster's.
    pub fn table(&self, reserved: &[Reserved], admins: &[String]) -> String {
        let mut s = format!("{:<20} {:<7} {:<10} {:<12} {}\n", "USER", "UID", "ROLE", "FROM", "NAME");
        for r in reserved {
            let role = if admins.contains(&r.user) {
                "instructor"
            } else {
                "student"
            };
            let _ = writeln!(s, "{:<20} {:<7} {role:<10} {:<12} -", r.user, r.uid, "cluster.toml");
        }
        for a in &self.accounts {
            let _ = writeln!(s, "{:<20} {:<7} {:<10} {:<12} {}", a.user, a.uid, a.role(), "roster", a.name());
        }
        s
    }
}

/// Reads the state file (none yet: an empty roster).
pub fn load(path: &Path) -> Result<RosterState, String> {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
            RosterState::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(RosterState::default()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

/// Writes the state file whole (a temporary file renamed over it, 0600).
pub fn store(path: &Path, state: &RosterState) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        let _ = std::fs::remove_file(&tmp);
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(state.render().as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| format!("cannot write {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(user: &str, name: &str, email: &str, instructor: bool) -> Entry {
        Entry {
            line: 1,
            user: user.into(),
            name: name.into(),
            email: email.into(),
            instructor,
        }
    }

    fn reserved() -> Vec<Reserved> {
        vec!["dlg-test1:3001".parse().unwrap(), "dlg-test2:3002".parse().unwrap()]
    }

    #[test]
    fn new_entries_get_the_first_free_uids_and_a_second_add_changes_nothing() {
        let mut s = RosterState::default();
        let roster = [
            entry("ada", "Ada Lovelace", "ada@example.org", false),
            entry("dlg-test1", "", "", false),
            entry("prof", "Prof", "", true),
        ];
        // 3001 and 3002 are cluster.toml's, 3003 the admin group's.
        let added = s.add(&roster, &reserved(), &[3003], 3001);
        let got: Vec<(&str, u32)> = added.iter().map(|a| (a.user.as_str(), a.uid)).collect();
        assert_eq!(got, [("ada", 3004), ("prof", 3005)]);
        assert_eq!(
            s.render(),
            "ada 3004 student Ada Lovelace,,,ada@example.org\nprof 3005 instructor Prof\n"
        );
        assert_eq!(RosterState::parse(&s.render()).unwrap(), s);
        assert!(s.add(&roster, &reserved(), &[3003], 3001).is_empty());
        // A removed account's uid is free again for the next one.
        s.remove("ada", &reserved()).unwrap();
        let added = s.add(&[entry("bo", "", "", false)], &reserved(), &[3003], 3001);
        assert_eq!((added[0].uid, added[0].gecos.as_str()), (3004, "bo"));
    }

    #[test]
    fn removal_names_what_cannot_be_removed() {
        let mut s = RosterState::parse("ada 3004 student Ada\n").unwrap();
        assert_eq!(
            s.remove("dlg-test1", &reserved()).unwrap_err(),
            "dlg-test1 is an account of cluster.toml: remove it there (DELEGATE_STACK_USERS) and run update"
        );
        assert_eq!(
            s.remove("zed", &reserved()).unwrap_err(),
            "zed is not an account of the stack's roster"
        );
        assert_eq!(s.remove("ada", &reserved()).unwrap().uid, 3004);
        assert!(s.accounts.is_empty());
    }

    #[test]
    fn a_damaged_state_file_is_named_not_used() {
        for (text, why) in [
            ("ada x student A\n", "line 1: uid \"x\" is not a number"),
            ("# c\nada 3004 teacher A\n", "line 2: role \"teacher\""),
            (
                "ada 3004 student A\nada 3005 student B\n",
                "line 2: ada (uid 3005) is there twice",
            ),
            ("root;x 3004 student A\n", "is not a user name"),
        ] {
            let e = RosterState::parse(text).unwrap_err();
            assert!(e.contains(why), "{e}");
        }
    }

    #[test]
    fn the_list_shows_both_sources() {
        let s = RosterState::parse("prof 3005 instructor Prof P,,,p@example.org\n").unwrap();
        let t = s.table(&reserved(), &["dlg-test2".to_owned()]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[1].starts_with("dlg-test1            3001    student    cluster.toml -"),
            "{t}"
        );
        assert!(lines[2].contains("instructor"), "{t}");
        assert!(lines[3].ends_with("roster       Prof P"), "{t}");
    }

    #[test]
    fn the_state_file_is_written_whole_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("roster");
        assert_eq!(load(&p).unwrap(), RosterState::default());
        let s = RosterState::parse("ada 3004 student Ada\n").unwrap();
        store(&p, &s).unwrap();
        assert_eq!(load(&p).unwrap(), s);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
    }
}
