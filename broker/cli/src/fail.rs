//! A failure of the CLI: one sentence and an exit code.

/// A failure of the CLI: one sentence and an exit code.
pub struct Fail {
    pub msg: String,
    pub code: u8,
}

impl Fail {
    pub fn new(msg: impl Into<String>, code: u8) -> Fail {
        Fail { msg: msg.into(), code }
    }
}

impl<E: std::error::Error> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail::new(e.to_string(), 1)
    }
}

/// The exit code of a command, or its failure.
pub type CliResult = Result<u8, Fail>;
