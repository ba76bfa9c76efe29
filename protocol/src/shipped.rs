//! Files a student ships with a job (`delegate submit --file PATH`, a jobs
//! file's `files:`, Python's `files=[...]`): copied by the client into the
//! job directory before submission, each under its own name at the top of
//! the directory (the sandbox sees `/job/<name>`), and listed one name per
//! line in the [`SHIPPED`] manifest so that the runner accepts exactly
//! those entries beside its own files.

use crate::layout::DELEGATE_NAMES;
pub use crate::layout::SHIPPED;
/// At most this many top-level entries may be shipped with one job.
pub const MAX_SHIPPED: usize = 32;
/// Longest name of a shipped entry (bytes).
pub const MAX_SHIPPED_NAME: usize = 255;

/// Why a name cannot be shipped, in one sentence (None: it can).
pub fn shipped_name_problem(name: &str) -> Option<String> {
    let reserved = DELEGATE_NAMES;
    // A rank's copy of a file (`stdout.3`) is delegate's too.
    let rank_copy = name
        .rsplit_once('.')
        .is_some_and(|(b, n)| reserved.contains(&b) && !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()));
    if name.is_empty() || name.len() > MAX_SHIPPED_NAME {
        Some(format!("the name {name:?} must be 1 to {MAX_SHIPPED_NAME} bytes"))
    } else if name.starts_with('.')
        || name.contains('/')
        || name.chars().any(|c| c.is_control() || crate::cancel::is_format_char(c))
    {
        Some(format!(
            "the name {name:?} cannot be shipped (no leading dot, slash or control character)"
        ))
    } else if reserved.contains(&name) || rank_copy {
        Some(format!(
            "the name {name:?} is one of delegate's own files in the job directory; rename it"
        ))
    } else {
        None
    }
}

/// The manifest's text for these names.
pub fn shipped_manifest(names: &[String]) -> String {
    names.iter().map(|n| format!("{n}\n")).collect()
}

/// The names a manifest lists, each checked; an error names the first bad
/// line.
pub fn parse_shipped_manifest(text: &str) -> Result<Vec<String>, String> {
    let names: Vec<String> = text.lines().map(str::to_owned).collect();
    if names.len() > MAX_SHIPPED {
        return Err(format!("the manifest lists {} entries, more than {MAX_SHIPPED}", names.len()));
    }
    for n in &names {
        if let Some(p) = shipped_name_problem(n) {
            return Err(p);
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_cannot_be_shipped() {
        for ok in ["train.py", "data", "my results.csv", "spec.py", "stdout-copy"] {
            assert_eq!(shipped_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            ".hidden",
            "a/b",
            "spec",
            "payload",
            "result",
            "stdout.3",
            "outcome.0",
            "shipped",
            "raised",
            "repeats",
            "fingerprint",
            "repeats.2",
            "a\nb",
        ] {
            assert!(shipped_name_problem(bad).is_some(), "{bad:?}");
        }
        assert!(shipped_name_problem(&"x".repeat(256)).is_some());
    }

    #[test]
    fn manifests_round_trip_and_are_bounded() {
        let names = vec!["train.py".to_owned(), "data".to_owned()];
        assert_eq!(parse_shipped_manifest(&shipped_manifest(&names)).unwrap(), names);
        assert_eq!(
            parse_shipped_manifest("spec\n"),
            Err("the name \"spec\" is one of delegate's own files in the job directory; rename it".to_owned())
        );
        let many: Vec<String> = (0..=MAX_SHIPPED).map(|i| format!("f{i}")).collect();
        assert_eq!(
            parse_shipped_manifest(&shipped_manifest(&many)),
            Err(format!(
                "the manifest lists {} entries, more than {MAX_SHIPPED}",
                MAX_SHIPPED + 1
            ))
        );
    }
}
