//! The agent's log file, rotated by the agent itself at a size cap: the
//! log sits on `/` beside Slurm's state, the database and Docker, and
//! nothing a student does may grow it without bound (security round 4,
//! item 3). At [`CAP`] bytes the file becomes `<log>.1` (replacing the
//! older one) and a new file is started, so the log takes at most twice
//! the cap, whether or not the machine runs logrotate.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The size at which the log is rotated.
pub const CAP: u64 = 64 << 20;

/// An append-only log file that rotates itself at `cap` bytes.
pub struct Rotating {
    path: PathBuf,
    file: File,
    size: u64,
    cap: u64,
}

/// The log's file: created 0640 (it names every student's jobs and uids;
/// root and group adm read it), appended to.
fn open(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).mode(0o640).open(path)
}

impl Rotating {
    pub fn open(path: &Path, cap: u64) -> std::io::Result<Rotating> {
        let file = open(path)?;
        let size = file.metadata()?.len();
        Ok(Rotating {
            path: path.to_path_buf(),
            file,
            size,
            cap,
        })
    }

    /// `<log>.1`.
    pub fn previous(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".1");
        PathBuf::from(p)
    }

    fn rotate(&mut self) -> std::io::Result<()> {
        std::fs::rename(&self.path, Self::previous(&self.path))?;
        self.file = open(&self.path)?;
        self.size = 0;
        Ok(())
    }
}

impl Write for Rotating {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.size > 0 && self.size + buf.len() as u64 > self.cap {
            // A log that cannot rotate keeps appending (no line is lost).
            let _ = self.rotate();
        }
        let n = self.file.write(buf)?;
        self.size += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_log_rotates_at_its_cap_and_keeps_one_older_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.log");
        let mut log = Rotating::open(&path, 1000).unwrap();
        let line = [b'x'; 99];
        for _ in 0..100 {
            log.write_all(&line).unwrap();
            log.write_all(b"\n").unwrap();
        }
        let now = std::fs::metadata(&path).unwrap();
        let older = std::fs::metadata(Rotating::previous(&path)).unwrap();
        assert!(now.len() <= 1000 && older.len() <= 1000, "{} {}", now.len(), older.len());
        assert_eq!(now.permissions().mode() & 0o777, 0o640);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2, "one older file, not more");
        // A log that was already there counts from its size.
        drop(log);
        let mut again = Rotating::open(&path, 1000).unwrap();
        again.write_all(&[b'y'; 990]).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() <= 1000);
    }
}
