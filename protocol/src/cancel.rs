//! The `cancel` marker of a job directory: its presence asks for the job to
//! end; its content, when it has any, says why in the user's words (a map
//! drops its remaining calls after one failed: "call 5 of this map raised
//! ZeroDivisionError"). Written by the client, read by the runner and the
//! client (the user's own file: bounded, one printable line).

use std::os::fd::AsFd;
use std::path::Path;

use crate::{read_bounded_at, CANCEL};

/// Longest reason kept (characters); the marker is read up to 4 bytes a
/// character more.
pub const MAX_CANCEL_REASON: usize = 200;

/// The reason written in a marker: one line of printable characters, at
/// most [`MAX_CANCEL_REASON`]; None when empty or not text.
pub fn cancel_reason_of(raw: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(raw).ok()?;
    let line: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .filter(|&c| !c.is_control() && !is_format_char(c))
        .take(MAX_CANCEL_REASON)
        .collect();
    (!line.is_empty()).then_some(line)
}

/// Invisible characters that reorder or hide text on a terminal (Unicode
/// format characters: bidirectional overrides, zero-width ones, BOM).
pub fn is_format_char(c: char) -> bool {
    matches!(c, '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{206F}' | '\u{FEFF}' | '\u{FFF9}'..='\u{FFFB}')
}

/// The reason of the marker in `dir` (None: absent, empty or unreadable).
pub fn read_cancel_reason(dir: impl AsFd, dir_path: &Path) -> Option<String> {
    let raw = read_bounded_at(dir, dir_path, CANCEL, (MAX_CANCEL_REASON * 4) as u64, None).ok()?;
    cancel_reason_of(&raw)
}

/// The reason of a job cancelled before it started: `cancelled: <reason>`
/// when the marker says why, else `cancelled before it started`.
pub fn cancelled_before_start(reason: Option<&str>) -> String {
    match reason {
        Some(r) => format!("cancelled: {r}"),
        None => "cancelled before it started".to_owned(),
    }
}

/// A cancelled job's reason in the user's words: `cancelled: <reason>`
/// when the marker says why, else `cancelled by the user`.
pub fn cancelled_by(reason: Option<&str>) -> String {
    match reason {
        Some(r) => format!("cancelled: {r}"),
        None => "cancelled by the user".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_one_bounded_printable_line() {
        assert_eq!(cancel_reason_of(b""), None);
        assert_eq!(cancel_reason_of(b" \n\t"), None);
        assert_eq!(cancel_reason_of(b"\xff\xfe"), None);
        assert_eq!(
            cancel_reason_of(b"call 5 of this map\n raised ZeroDivisionError\x1b[31m").as_deref(),
            Some("call 5 of this map raised ZeroDivisionError[31m")
        );
        assert_eq!(
            cancel_reason_of("é".repeat(500).as_bytes()).map(|r| r.chars().count()),
            Some(MAX_CANCEL_REASON)
        );
        assert_eq!(cancel_reason_of("a\u{202E}b\u{200B}c".as_bytes()).as_deref(), Some("abc"));
        assert_eq!(cancelled_by(None), "cancelled by the user");
        assert_eq!(cancelled_before_start(None), "cancelled before it started");
        assert_eq!(
            cancelled_by(Some("call 2 of this map raised E")),
            "cancelled: call 2 of this map raised E"
        );
    }

    #[test]
    fn the_marker_is_read_bounded() {
        let d = tempfile::tempdir().unwrap();
        let fd = crate::open_dir_nofollow(d.path()).unwrap();
        assert_eq!(read_cancel_reason(&fd, d.path()), None);
        std::fs::write(d.path().join(CANCEL), b"").unwrap();
        assert_eq!(read_cancel_reason(&fd, d.path()), None);
        std::fs::write(d.path().join(CANCEL), b"call 3 of this map raised ValueError").unwrap();
        assert_eq!(
            read_cancel_reason(&fd, d.path()).as_deref(),
            Some("call 3 of this map raised ValueError")
        );
        std::fs::write(d.path().join(CANCEL), vec![b'x'; 10_000]).unwrap();
        assert_eq!(read_cancel_reason(&fd, d.path()), None, "an oversized marker gives no reason");
    }
}
