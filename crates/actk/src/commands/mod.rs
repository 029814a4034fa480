pub mod cdi;
pub mod config;
pub mod info;
pub mod labels;
pub mod list;
pub mod node;
pub mod runtime;
pub mod who;

/// SIGTERM/SIGINT for the long-running subcommands (`cdi generate --watch`, `node setup
/// --wait`): a tokio signal handler on a thread of its own, so the callers stay synchronous.
pub struct Stop(std::sync::mpsc::Receiver<()>);

impl Stop {
    /// Installs the handlers; from now on SIGTERM and SIGINT no longer kill the process.
    pub fn install() -> anyhow::Result<Stop> {
        use anyhow::Context;
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting tokio")?;
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<std::io::Result<()>>();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            rt.block_on(async move {
                use tokio::signal::unix::{SignalKind, signal};
                let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                    (Ok(t), Ok(i)) => (t, i),
                    (Err(e), _) | (_, Err(e)) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
                let _ = tx.send(());
            })
        });
        ready_rx.recv().context("the signal thread ended")?.context("installing SIGTERM/SIGINT handlers")?;
        Ok(Stop(rx))
    }

    /// Waits up to `d`; true once a signal came.
    pub fn wait(&self, d: std::time::Duration) -> bool {
        !matches!(self.0.recv_timeout(d), Err(std::sync::mpsc::RecvTimeoutError::Timeout))
    }
}
pub mod system;
