//! Test helper: prints the started record and the outcome of a job directory.
//! `showjob <job-dir>`

use std::path::PathBuf;

use delegate_protocol::{open_dir_nofollow, read_record_at, Outcome, Started};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = PathBuf::from(std::env::args().nth(1).ok_or("usage: showjob <job-dir>")?);
    let fd = open_dir_nofollow(&dir)?;
    match read_record_at::<Started>(&fd, &dir, None) {
        Ok(s) => println!("started: {s:?}"),
        Err(e) => println!("started: none ({e})"),
    }
    match read_record_at::<Outcome>(&fd, &dir, None) {
        Ok(o) => println!("outcome: {o:?}"),
        Err(e) => println!("outcome: none ({e})"),
    }
    Ok(())
}
