//! One runner's connection: frames in (with the descriptors a `Run`
//! carries), frames out. Reading runs in its own task and hands whole
//! requests over a channel, so the job's supervision sees a `Kill` or the
//! runner's end at any time.

use std::collections::VecDeque;
use std::io::IoSliceMut;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use delegate_protocol::agent::{frame, Answer, FrameBuf, Request, RUN_FDS};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
use tokio::io::Interest;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

/// At most this many descriptors may wait unclaimed (one `Run` carries 3).
const MAX_QUEUED_FDS: usize = 6;

/// A request with its descriptors (only `Run` has any).
pub struct Incoming {
    pub request: Request,
    pub fds: Vec<OwnedFd>,
}

/// An admitted connection: the socket and its place in the agent's bounds
/// ([`crate::caller::admit::Ticket`]), given back exactly when the descriptor is
/// closed, that is when the last holder (the serving task or the reader)
/// drops it.
pub struct Socket {
    stream: UnixStream,
    _ticket: crate::caller::admit::Ticket,
}

impl Socket {
    pub fn new(stream: UnixStream, ticket: crate::caller::admit::Ticket) -> Socket {
        Socket { stream, _ticket: ticket }
    }
}

impl std::ops::Deref for Socket {
    type Target = UnixStream;
    fn deref(&self) -> &UnixStream {
        &self.stream
    }
}

/// The reader task of a connection. Dropping it (whenever serving ends,
/// however) ends the reader and shuts the socket both ways, so the
/// descriptor is closed and the ticket given back at once, whatever the
/// peer does (security round 4, item 1: a peer that shut its read side
/// kept its connection, and its place, for as long as it lived).
pub struct Reader {
    task: tokio::task::JoinHandle<()>,
    socket: Arc<Socket>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
        let _ = nix::sys::socket::shutdown(self.socket.as_raw_fd(), nix::sys::socket::Shutdown::Both);
    }
}

/// Reads requests until the peer closes or misbehaves; the channel closes
/// then. The reader lives no longer than the returned [`Reader`].
pub fn spawn_reader(socket: Arc<Socket>) -> (mpsc::Receiver<Incoming>, Reader) {
    let (tx, rx) = mpsc::channel(4);
    let stream = socket.clone();
    let task = tokio::spawn(async move {
        if let Err(e) = read_loop(&stream, &tx).await {
            tracing::debug!("connection closed: {e}");
        }
    });
    (rx, Reader { task, socket })
}

/// Why a connection's reading ended.
#[derive(Debug, thiserror::Error)]
enum ReadError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Frame(#[from] delegate_protocol::ProtocolError),
    #[error("too many descriptors in one message")]
    TruncatedFds,
    #[error("too many descriptors")]
    TooManyFds,
    #[error("end of stream")]
    End,
    #[error("a run request without its descriptors")]
    RunWithoutFds,
}

async fn read_loop(stream: &UnixStream, tx: &mpsc::Sender<Incoming>) -> Result<(), ReadError> {
    let mut frames = FrameBuf::default();
    let mut fds: VecDeque<OwnedFd> = VecDeque::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        stream.readable().await?;
        let got = stream.try_io(Interest::READABLE, || {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 4]);
            let msg = recvmsg::<()>(stream.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
                .map_err(std::io::Error::from)?;
            let mut new_fds = Vec::new();
            for c in msg.cmsgs().map_err(std::io::Error::from)? {
                if let ControlMessageOwned::ScmRights(raw) = c {
                    for fd in raw {
                        // SAFETY: the kernel just installed these descriptors for us.
                        new_fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    }
                }
            }
            let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
            Ok((msg.bytes, new_fds, truncated))
        });
        let (n, new_fds, truncated) = match got {
            Ok(v) => v,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        };
        if truncated {
            return Err(ReadError::TruncatedFds);
        }
        fds.extend(new_fds);
        if fds.len() > MAX_QUEUED_FDS {
            return Err(ReadError::TooManyFds);
        }
        if n == 0 {
            return Err(ReadError::End);
        }
        frames.push(&buf[..n]);
        while let Some(request) = frames.next_frame::<Request>()? {
            let take = if matches!(request, Request::Run(_) | Request::RunRank(_)) {
                RUN_FDS
            } else {
                0
            };
            if fds.len() < take {
                return Err(ReadError::RunWithoutFds);
            }
            let mine: Vec<OwnedFd> = fds.drain(..take).collect();
            if tx.send(Incoming { request, fds: mine }).await.is_err() {
                return Ok(());
            }
        }
    }
}

/// Sends one answer. Errors mean the runner is gone.
pub async fn send(stream: &UnixStream, answer: &Answer) -> std::io::Result<()> {
    let bytes = frame(answer).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut done = 0;
    while done < bytes.len() {
        stream.writable().await?;
        match stream.try_write(&bytes[done..]) {
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
