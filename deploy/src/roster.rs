//! The course's roster: a CSV file `username,full name[,email][,role]`
//! (quoted fields may hold commas; a header line `username,...` and blank
//! or `#` lines are skipped; a UTF-8 byte order mark is allowed). Each line
//! is checked here, so build_cluster.sh creates accounts only from rows
//! that can be used.

/// One checked roster line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The line of the file (for messages).
    pub line: u64,
    pub user: String,
    pub name: String,
    pub email: String,
    pub instructor: bool,
}

/// A roster that cannot be used: the line and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("roster line {line}: {why}")]
pub struct RosterError {
    pub line: u64,
    pub why: String,
}

/// At most this many lines (a course, not a directory service).
pub const MAX_ENTRIES: usize = 20_000;

fn is_user_name(s: &str) -> bool {
    crate::settings::is_unix_name(s)
}

/// A name or email as a GECOS field takes it: printable, no ':' (the
/// passwd separator), commas (GECOS's separator) and '|' turned to spaces.
fn field(line: u64, what: &str, raw: &str) -> Result<String, RosterError> {
    if raw.contains(':') {
        return Err(RosterError {
            line,
            why: format!("':' is not allowed in the {what}"),
        });
    }
    if raw.chars().any(char::is_control) || raw.len() > 200 {
        return Err(RosterError {
            line,
            why: format!("the {what} has unprintable characters or is longer than 200 bytes"),
        });
    }
    Ok(raw.replace([',', '|'], " ").trim().to_owned())
}

fn entry(line: u64, row: &csv::StringRecord, all_instructors: bool) -> Result<Option<Entry>, RosterError> {
    let cell = |i: usize| row.get(i).unwrap_or("").trim();
    let user = cell(0);
    if row.iter().all(|c| c.trim().is_empty())
        || user.starts_with('#')
        || (line == 1 && user.eq_ignore_ascii_case("username"))
    {
        return Ok(None);
    }
    if !is_user_name(user) {
        let shown: String = user.chars().take(40).map(|c| if c.is_control() { '?' } else { c }).collect();
        return Err(RosterError {
            line,
            why: format!("'{shown}' is not a valid user name (lower case letters, digits, _ and -)"),
        });
    }
    let instructor = match cell(3).to_ascii_lowercase().as_str() {
        "" | "student" => all_instructors,
        "instructor" => true,
        other => {
            let shown: String = other.chars().take(40).filter(|c| !c.is_control()).collect();
            return Err(RosterError {
                line,
                why: format!("role '{shown}' is neither student nor instructor"),
            });
        }
    };
    Ok(Some(Entry {
        line,
        user: user.into(),
        name: field(line, "name", cell(1))?,
        email: field(line, "email", cell(2))?,
        instructor,
    }))
}

/// The roster's entries, each checked; a user named twice is an error.
pub fn parse(text: &str, all_instructors: bool) -> Result<Vec<Entry>, RosterError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    // Lines as a text editor counts them (the reader's count is off after
    // CRLF line ends, which spreadsheets write).
    let text = text.replace("\r\n", "\n");
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .comment(None)
        .from_reader(text.as_bytes());
    let mut out: Vec<Entry> = Vec::new();
    for record in reader.records() {
        let row = record.map_err(|e| RosterError {
            line: e.position().map_or(0, |p| p.line()),
            why: format!("not CSV: {e}"),
        })?;
        let line = row.position().map_or(0, |p| p.line());
        let Some(e) = entry(line, &row, all_instructors)? else {
            continue;
        };
        if let Some(first) = out.iter().find(|o| o.user == e.user) {
            return Err(RosterError {
                line,
                why: format!("{} is already on line {}", e.user, first.line),
            });
        }
        if out.len() == MAX_ENTRIES {
            return Err(RosterError {
                line,
                why: format!("more than {MAX_ENTRIES} entries"),
            });
        }
        out.push(e);
    }
    Ok(out)
}

/// `line|user|name|email|role` per entry, for build_cluster.sh.
pub fn lines(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| {
            let role = if e.instructor { "instructor" } else { "student" };
            format!("{}|{}|{}|{}|{role}\n", e.line, e.user, e.name, e.email)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_course_roster_with_quotes_header_comments_and_roles() {
        let text = "\u{feff}username,full name,email,role\r\nada,\"Lovelace, Ada\",ada@example.org\r\n\n# a comment\nbob,Bob,,Instructor\ncy,\"Cy \"\"the\"\" Pipe|r\"\n";
        let got = parse(text, false).unwrap();
        assert_eq!(
            lines(&got),
            "2|ada|Lovelace  Ada|ada@example.org|student\n5|bob|Bob||instructor\n6|cy|Cy \"the\" Pipe r||student\n"
        );
        assert!(parse(text, true).unwrap().iter().all(|e| e.instructor));
    }

    #[test]
    fn bad_lines_are_named() {
        let err = |t: &str| parse(t, false).unwrap_err().to_string();
        assert_eq!(
            err("ada,A\nAda B,x\n"),
            "roster line 2: 'Ada B' is not a valid user name (lower case letters, digits, _ and -)"
        );
        assert_eq!(err("ada,A:B\n"), "roster line 1: ':' is not allowed in the name");
        assert_eq!(
            err("ada,A,,teacher\n"),
            "roster line 1: role 'teacher' is neither student nor instructor"
        );
        assert_eq!(err("ada,A\nbob,B\nada,C\n"), "roster line 3: ada is already on line 1");
        assert!(err("ada,\"A\u{7}\"\n").contains("unprintable"));
        assert!(err("root;rm -rf /,x\n").contains("not a valid user name"));
    }
}
