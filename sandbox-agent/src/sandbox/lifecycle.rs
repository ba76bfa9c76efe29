//! What supervising a created sandbox asks of the container engine
//! ([`Lifecycle`]): attach to its output, start it, wait for its end, kill
//! it, read its last state. The Docker engine is the one implementation the
//! agent runs with; the unit tests of crate::sandbox::supervise run the same code
//! against a scripted engine (its exit, its output, a failing wait, an
//! engine that never answers).

use std::future::Future;
use std::pin::Pin;

use bollard::errors::Error as BollardError;
use bollard::models::{ContainerState, ContainerWaitResponse};
use bollard::query_parameters::{
    AttachContainerOptions, InspectContainerOptions, StartContainerOptions, WaitContainerOptions,
};
use bollard::Docker;
use futures_util::Stream;

use crate::sandbox::output::OutputStream;

/// The engine's answer to a wait: the exit (or an error) once.
pub type WaitStream<'a> = Pin<Box<dyn Stream<Item = Result<ContainerWaitResponse, BollardError>> + Send + 'a>>;

/// The engine operations of one sandbox's life after its creation.
pub trait Lifecycle: Sync {
    /// Its stdout and stderr, from now on.
    fn attach(&self, id: &str) -> impl Future<Output = Result<OutputStream, BollardError>> + Send;
    fn start(&self, id: &str) -> impl Future<Output = Result<(), BollardError>> + Send;
    /// Ends when the sandbox has ended.
    fn wait(&self, id: &str) -> WaitStream<'_>;
    /// SIGKILL; a sandbox already gone is no error.
    fn kill(&self, id: &str) -> impl Future<Output = Result<(), BollardError>> + Send;
    /// Its last state (exit code, OOM kill, main pid).
    fn state(&self, id: &str) -> impl Future<Output = Result<Option<ContainerState>, BollardError>> + Send;
}

impl Lifecycle for Docker {
    async fn attach(&self, id: &str) -> Result<OutputStream, BollardError> {
        let opts = AttachContainerOptions {
            stream: true,
            stdout: true,
            stderr: true,
            stdin: false,
            logs: false,
            detach_keys: None,
        };
        // (nothing is written to the sandbox: its input is dropped)
        Ok(self.attach_container(id, Some(opts)).await?.output)
    }

    async fn start(&self, id: &str) -> Result<(), BollardError> {
        self.start_container(id, None::<StartContainerOptions>).await
    }

    fn wait(&self, id: &str) -> WaitStream<'_> {
        Box::pin(self.wait_container(id, None::<WaitContainerOptions>))
    }

    async fn kill(&self, id: &str) -> Result<(), BollardError> {
        crate::sandbox::engine::kill(self, id).await
    }

    async fn state(&self, id: &str) -> Result<Option<ContainerState>, BollardError> {
        Ok(self.inspect_container(id, None::<InspectContainerOptions>).await?.state)
    }
}

#[cfg(test)]
pub mod scripted {
    //! A scripted engine for unit tests: one sandbox that writes `output`
    //! and exits with `exit` (never, when `None`, until killed); its wait
    //! may fail instead; it records what was asked of it.

    use std::sync::atomic::{AtomicUsize, Ordering};

    use bollard::container::LogOutput;
    use futures_util::StreamExt;
    use tokio::sync::watch;

    use super::*;

    pub struct Scripted {
        pub output: Vec<u8>,
        pub oom: bool,
        /// The wait answers this error instead of the exit.
        pub wait_error: Option<fn() -> BollardError>,
        exit: watch::Sender<Option<i64>>,
        pub starts: AtomicUsize,
        pub kills: AtomicUsize,
    }

    impl Scripted {
        pub fn new(exit: Option<i64>, output: &[u8]) -> Scripted {
            Scripted {
                output: output.to_vec(),
                oom: false,
                wait_error: None,
                exit: watch::channel(exit).0,
                starts: AtomicUsize::new(0),
                kills: AtomicUsize::new(0),
            }
        }

        fn exit_code(&self) -> Option<i64> {
            *self.exit.borrow()
        }
    }

    impl Lifecycle for Scripted {
        async fn attach(&self, _id: &str) -> Result<OutputStream, BollardError> {
            let chunk = LogOutput::StdOut { message: self.output.clone().into() };
            let mut exited = self.exit.subscribe();
            // The output, then the end of the stream when the sandbox ends.
            let rest = futures_util::stream::once(async move {
                let _ = exited.wait_for(Option::is_some).await;
            })
            .filter_map(|()| async { None });
            Ok(Box::pin(futures_util::stream::iter([Ok(chunk)]).chain(rest)))
        }

        async fn start(&self, _id: &str) -> Result<(), BollardError> {
            self.starts.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }

        fn wait(&self, _id: &str) -> WaitStream<'_> {
            if let Some(e) = self.wait_error {
                return Box::pin(futures_util::stream::iter([Err(e())]));
            }
            let mut exited = self.exit.subscribe();
            Box::pin(futures_util::stream::once(async move {
                let code = exited.wait_for(Option::is_some).await.map(|c| c.unwrap_or(0)).unwrap_or(0);
                Ok(ContainerWaitResponse { status_code: code, error: None })
            }))
        }

        async fn kill(&self, _id: &str) -> Result<(), BollardError> {
            self.kills.fetch_add(1, Ordering::SeqCst);
            self.exit.send_if_modified(|e| e.is_none() && e.replace(137).is_none());
            Ok(())
        }

        async fn state(&self, _id: &str) -> Result<Option<ContainerState>, BollardError> {
            Ok(Some(ContainerState {
                exit_code: self.exit_code(),
                oom_killed: Some(self.oom),
                ..Default::default()
            }))
        }
    }
}
