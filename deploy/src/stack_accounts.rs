//! The stack's `accounts` and `admins` files, the configs every node's
//! entrypoint reads (docker/cluster-entrypoint.sh): cluster.toml's accounts
//! and the roster state's together, checked here once (names and uids
//! unique across both), and the admin group with cluster.toml's admins and
//! the roster's instructors.
//!
//! `accounts`: one account per line, `name uid[ role[ gecos]]`: no role for
//! cluster.toml's `stack_users`, `test` for its `stack_test_users` (not
//! logins of the hub), `student` or `instructor` for the roster's, with
//! their GECOS field. `admins`: one line, `group gid member,member`.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use crate::roster_state::{Reserved, RosterState};
use crate::{RenderError, Settings};

/// cluster.toml's accounts of one setting (`name:uid` words).
fn setting_accounts(s: &Settings, name: &str) -> Result<Vec<Reserved>, RenderError> {
    s.raw_or(name, "")
        .split_whitespace()
        .map(|w| w.parse::<Reserved>().map_err(|e| RenderError::Invalid(format!("{name}: {e}"))))
        .collect()
}

/// The `accounts` file: cluster.toml's (`user`, `test`), then the roster's.
pub fn accounts(s: &Settings, roster: &RosterState) -> Result<String, RenderError> {
    let mut out = String::new();
    let (mut names, mut uids) = (BTreeSet::new(), BTreeSet::new());
    let mut add = |user: &str, uid: u32, rest: &str| -> Result<(), RenderError> {
        if !names.insert(user.to_owned()) || !uids.insert(uid) {
            return Err(RenderError::Invalid(format!(
                "two accounts share a name or a uid ({user}, uid {uid}): cluster.toml's accounts and the roster's must differ"
            )));
        }
        let _ = writeln!(out, "{user} {uid}{}{rest}", if rest.is_empty() { "" } else { " " });
        Ok(())
    };
    for a in setting_accounts(s, "DELEGATE_STACK_USERS")? {
        add(&a.user, a.uid, "")?;
    }
    for a in setting_accounts(s, "DELEGATE_STACK_TEST_USERS")? {
        add(&a.user, a.uid, "test")?;
    }
    for a in &roster.accounts {
        let role = if a.instructor { "instructor" } else { "student" };
        add(&a.user, a.uid, &format!("{role} {}", a.gecos))?;
    }
    Ok(out)
}

/// The `admins` file: the admin group (`DELEGATE_STACK_ADMIN_GROUP`,
/// `name:gid`), its members cluster.toml's admins (each one of its
/// accounts) and the roster's instructors.
pub fn admins(s: &Settings, roster: &RosterState) -> Result<String, RenderError> {
    let group: Reserved = s
        .raw("DELEGATE_STACK_ADMIN_GROUP")?
        .parse()
        .map_err(|e| RenderError::Invalid(format!("DELEGATE_STACK_ADMIN_GROUP must be name:gid: {e}")))?;
    let members = admin_members(s, roster)?;
    Ok(format!("{} {} {}\n", group.user, group.uid, members.join(",")))
}

/// The `students` file: `name uid` of every account that is not an admin
/// (what the user node gives a munged and a query limit of its own).
pub fn students(s: &Settings, roster: &RosterState) -> Result<String, RenderError> {
    let members = admin_members(s, roster)?;
    let mut out = String::new();
    for line in accounts(s, roster)?.lines() {
        let mut f = line.split(' ');
        if let (Some(name), Some(uid)) = (f.next(), f.next()) {
            if !members.iter().any(|m| m == name) {
                let _ = writeln!(out, "{name} {uid}");
            }
        }
    }
    Ok(out)
}

/// The admin group's members: cluster.toml's admins, then the roster's
/// instructors.
fn admin_members(s: &Settings, roster: &RosterState) -> Result<Vec<String>, RenderError> {
    let known: Vec<Reserved> = [
        setting_accounts(s, "DELEGATE_STACK_USERS")?,
        setting_accounts(s, "DELEGATE_STACK_TEST_USERS")?,
    ]
    .concat();
    let mut members: Vec<String> = Vec::new();
    for m in s.raw_or("DELEGATE_STACK_ADMINS", "").split_whitespace() {
        if !known.iter().any(|a| a.user == m) {
            return Err(RenderError::Invalid(format!(
                "admin '{m}' (DELEGATE_STACK_ADMINS) is not an account of cluster.toml"
            )));
        }
        if !members.iter().any(|x| x == m) {
            members.push(m.to_owned());
        }
    }
    for a in roster.accounts.iter().filter(|a| a.instructor) {
        if !members.contains(&a.user) {
            members.push(a.user.clone());
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings::from_pairs([
            ("DELEGATE_STACK_USERS", "student:3000 ta:3001"),
            ("DELEGATE_STACK_TEST_USERS", "dlg-test1:3901"),
            ("DELEGATE_STACK_ADMIN_GROUP", "delegate-admin:3990"),
            ("DELEGATE_STACK_ADMINS", "ta"),
        ])
    }

    fn roster() -> RosterState {
        RosterState::parse("ann 4000 student Ann Day,,,ann@example.org\nprof 4001 instructor Prof Day\n").unwrap()
    }

    #[test]
    fn the_accounts_of_cluster_toml_and_the_roster_in_one_file() {
        assert_eq!(
            accounts(&settings(), &roster()).unwrap(),
            "student 3000\nta 3001\ndlg-test1 3901 test\n\
             ann 4000 student Ann Day,,,ann@example.org\nprof 4001 instructor Prof Day\n"
        );
        assert_eq!(accounts(&settings(), &RosterState::default()).unwrap().lines().count(), 3);
    }

    #[test]
    fn the_students_are_every_account_but_the_admins() {
        // ta is cluster.toml's admin, prof the roster's instructor.
        assert_eq!(
            students(&settings(), &roster()).unwrap(),
            "student 3000\ndlg-test1 3901\nann 4000\n"
        );
    }

    #[test]
    fn a_name_or_uid_twice_is_refused() {
        let same_uid = RosterState::parse("ann 3000 student Ann\n").unwrap();
        let e = accounts(&settings(), &same_uid).unwrap_err().to_string();
        assert!(e.contains("two accounts share a name or a uid (ann, uid 3000)"), "{e}");
        let same_name = RosterState::parse("ta 4000 student Ta\n").unwrap();
        let e = accounts(&settings(), &same_name).unwrap_err().to_string();
        assert!(e.contains("two accounts share a name or a uid (ta, uid 4000)"), "{e}");
        let twice = settings().with("DELEGATE_STACK_TEST_USERS", "student:3902");
        let e = accounts(&twice, &RosterState::default()).unwrap_err().to_string();
        assert!(e.contains("two accounts share a name or a uid (student, uid 3902)"), "{e}");
    }

    #[test]
    fn the_admins_are_cluster_tomls_and_the_rosters_instructors() {
        assert_eq!(admins(&settings(), &roster()).unwrap(), "delegate-admin 3990 ta,prof\n");
        assert_eq!(
            admins(&settings().with("DELEGATE_STACK_ADMINS", ""), &RosterState::default()).unwrap(),
            "delegate-admin 3990 \n"
        );
        let stranger = settings().with("DELEGATE_STACK_ADMINS", "ann");
        let e = admins(&stranger, &roster()).unwrap_err().to_string();
        assert!(
            e.contains("admin 'ann' (DELEGATE_STACK_ADMINS) is not an account of cluster.toml"),
            "{e}"
        );
        let bad = settings().with("DELEGATE_STACK_ADMIN_GROUP", "delegate-admin");
        let e = admins(&bad, &roster()).unwrap_err().to_string();
        assert!(
            e.contains("DELEGATE_STACK_ADMIN_GROUP must be name:gid: \"delegate-admin\" is not name:uid"),
            "{e}"
        );
    }
}
