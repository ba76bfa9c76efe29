//! The runner's side of the agent connection (`delegate_protocol::agent`):
//! one connection per runner process (so one identity check per
//! allocation, however many calls a batch runs).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

use std::time::{Duration, Instant};

use delegate_protocol::agent::{frame, Answer, FrameBuf, Request, IDLE_SECS};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
use tokio::io::{AsyncReadExt, Interest};
use tokio::net::UnixStream;

pub struct Agent {
    stream: UnixStream,
    frames: FrameBuf,
    socket: String,
    /// When the last answer came (or the connection was made).
    last_answer: Instant,
}

impl Agent {
    pub async fn connect(socket: &Path) -> Result<Agent, String> {
        let shown = socket.display().to_string();
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|e| format!("cannot reach the delegate agent at {shown}: {e}"))?;
        Ok(Agent {
            stream,
            frames: FrameBuf::default(),
            socket: shown,
            last_answer: Instant::now(),
        })
    }

    /// Whether the agent may close this connection soon for being idle
    /// (`IDLE_SECS`): the runner then makes a new one.
    pub fn nearly_idle(&self) -> bool {
        self.last_answer.elapsed() > Duration::from_secs(IDLE_SECS / 2)
    }

    /// Sends a request, with descriptors when given (one `sendmsg`).
    pub async fn send(&self, req: &Request, fds: &[BorrowedFd<'_>]) -> Result<(), String> {
        let bytes = frame(req).map_err(|e| e.to_string())?;
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let mut done = 0;
        while done < bytes.len() {
            self.stream.writable().await.map_err(|e| self.broken(e))?;
            let first = done == 0;
            let r = self.stream.try_io(Interest::WRITABLE, || {
                let iov = [IoSlice::new(&bytes[done..])];
                let cmsg = [ControlMessage::ScmRights(&raw)];
                let c: &[ControlMessage] = if first && !raw.is_empty() { &cmsg } else { &[] };
                sendmsg::<()>(self.stream.as_raw_fd(), &iov, c, MsgFlags::MSG_NOSIGNAL, None)
                    .map_err(std::io::Error::from)
            });
            match r {
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(self.broken(e)),
            }
        }
        Ok(())
    }

    /// The next answer; `Err` when the agent closed the connection or sent garbage.
    pub async fn recv(&mut self) -> Result<Answer, String> {
        let mut buf = [0u8; 8192];
        loop {
            if let Some(a) = self.frames.next_frame::<Answer>().map_err(|e| e.to_string())? {
                self.last_answer = Instant::now();
                return Ok(a);
            }
            let n = self.stream.read(&mut buf).await.map_err(|e| self.broken(e))?;
            if n == 0 {
                return Err(format!("the delegate agent at {} closed the connection", self.socket));
            }
            self.frames.push(&buf[..n]);
        }
    }

    fn broken(&self, e: std::io::Error) -> String {
        format!("the connection to the delegate agent at {} broke: {e}", self.socket)
    }
}
