//! The `slurm-id` file of a job directory and the list of the calls that
//! share one allocation (`<root>/shared-<slurm-id>.calls`).

use crate::JobId;

/// The content of a `slurm-id` file: the Slurm id of the job (`123`) or job
/// array element (`123_4`) that runs the call, and, when that allocation
/// runs `shared` calls of one submission one after another (each in its own
/// container), a second line `shared <n>`.
pub fn format_slurm_id(slurm_id: &str, shared: Option<u32>) -> String {
    match shared {
        Some(n) => format!("{slurm_id}\nshared {n}\n"),
        None => format!("{slurm_id}\n"),
    }
}

/// The name (in the delegate root) of the list of the calls that share the
/// allocation `slurm_id`.
pub fn shared_calls_name(slurm_id: &str) -> String {
    format!("shared-{slurm_id}.calls")
}

/// Parses a list of calls ([`shared_calls_name`]): the valid job ids in it
/// (anything else is ignored).
pub fn parse_shared_calls(text: &str) -> Vec<JobId> {
    text.lines().filter_map(|l| JobId::parse(l.trim()).ok()).collect()
}

/// Parses a `slurm-id` file ([`format_slurm_id`]); `None` when it holds no
/// job id (junk is never trusted as one).
pub fn parse_slurm_id(text: &str) -> Option<(String, Option<u32>)> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let id = lines.next()?;
    let id_ok = id.bytes().next().is_some_and(|b| b.is_ascii_digit())
        && id.bytes().all(|c| c.is_ascii_digit() || c == b'_')
        && id.matches('_').count() <= 1
        && !id.ends_with('_');
    if !id_ok {
        return None;
    }
    let shared = match lines.next() {
        None => None,
        Some(l) => match l.strip_prefix("shared ").and_then(|n| n.trim().parse::<u32>().ok()) {
            Some(n) if n >= 1 => Some(n),
            _ => return None,
        },
    };
    if lines.next().is_some() {
        return None;
    }
    Some((id.to_owned(), shared))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_id_files() {
        for (sid, shared) in [("12", None), ("12_3", Some(7)), ("9", Some(1))] {
            assert_eq!(parse_slurm_id(&format_slurm_id(sid, shared)), Some((sid.to_owned(), shared)));
        }
        assert_eq!(parse_slurm_id("  42 \n"), Some(("42".into(), None)));
        for junk in [
            "",
            "\n",
            "abc",
            "_1",
            "1_",
            "1__2",
            "1_2_3",
            "12\nshared x",
            "12\nshared 0",
            "12\nshared 3\nmore",
            "12\nother 3",
        ] {
            assert_eq!(parse_slurm_id(junk), None, "{junk:?}");
        }
    }
}
