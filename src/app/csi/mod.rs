//! `fencefs csi`: the Kubernetes CSI node plugin (Identity and Node services, CSI 1.x, on
//! a Unix socket the kubelet calls through node-driver-registrar). It only mounts: each
//! inline `fencefs.dev` volume is a fresh `/dev/fuse` mounted at the kubelet's target and
//! handed to the pod's unprivileged `fencefs mount --fuse-fd-from` sidecar, which serves it.
//!
//! The parts: `attrs` (the volume's attributes, the sidecar socket's place), `node` (the
//! gRPC services, publish and unpublish), `handover` (the descriptors' way to the
//! sidecars, on one thread for all volumes, and a fresh mount when a sidecar restarts).
//!
//! Invariants: the gRPC server runs on a Tokio runtime of its own thread (nothing here
//! serves FUSE; the daemon's FUSE paths have no async code); SIGINT/SIGTERM/SIGHUP are
//! blocked before that thread starts and taken by the main thread, which removes the
//! endpoint's socket and exits (published mounts stay: each is its sidecar's, and the
//! kubelet unpublishes them through the next driver).

mod attrs;
mod handover;
mod node;

use std::path::PathBuf;
use std::sync::Arc;

use bpfman_csi::v1 as csi;
use nix::sys::signal::{SigSet, Signal};

use crate::cli::CsiArgs;

/// The socket path of a `unix://PATH` (or `unix:PATH`) endpoint.
fn endpoint_path(e: &str) -> Result<PathBuf, String> {
    let p = e
        .strip_prefix("unix://")
        .or_else(|| e.strip_prefix("unix:"))
        .ok_or_else(|| format!("--endpoint '{e}': expected unix:///PATH"))?;
    if !p.starts_with('/') {
        return Err(format!(
            "--endpoint '{e}': the socket path must be absolute"
        ));
    }
    Ok(PathBuf::from(p))
}

/// Runs the plugin until SIGINT/SIGTERM; returns the exit code.
pub(super) fn run(a: CsiArgs) -> i32 {
    match serve(a) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("fencefs: csi: {e}");
            super::EXIT_ERR
        }
    }
}

fn serve(a: CsiArgs) -> Result<(), String> {
    let sock = endpoint_path(&a.endpoint)?;
    let mut sigs = SigSet::empty();
    for s in [Signal::SIGHUP, Signal::SIGINT, Signal::SIGTERM] {
        sigs.add(s);
    }
    sigs.thread_block()
        .map_err(|e| format!("cannot block signals: {e}"))?;
    if std::fs::symlink_metadata(&sock).is_ok() {
        std::fs::remove_file(&sock).map_err(|e| format!("{}: {e}", sock.display()))?;
    }
    let std_listener = std::os::unix::net::UnixListener::bind(&sock)
        .map_err(|e| format!("cannot listen on {}: {e}", sock.display()))?;
    std_listener
        .set_nonblocking(true)
        .map_err(|e| e.to_string())?;
    let driver = Arc::new(node::Driver::new(a.driver_name, a.node_id)?);
    log::info!(
        "csi: {} on node {} listening on {}",
        driver.name,
        driver.node_id,
        sock.display()
    );
    std::thread::Builder::new()
        .name("fencefs-csi-grpc".into())
        .spawn(move || {
            if let Err(e) = grpc(std_listener, driver) {
                log::error!("csi: the gRPC server stopped: {e}");
                std::process::exit(super::EXIT_ERR);
            }
        })
        .map_err(|e| e.to_string())?;
    loop {
        match sigs.wait() {
            Ok(Signal::SIGHUP) => continue,
            Ok(s) => {
                log::info!("csi: {s:?}: stopping (published volumes stay mounted)");
                break;
            }
            Err(e) => return Err(format!("sigwait: {e}")),
        }
    }
    let _ = std::fs::remove_file(&sock);
    Ok(())
}

/// The gRPC server, on a current-thread runtime (spawn_blocking for the syscalls).
fn grpc(l: std::os::unix::net::UnixListener, driver: Arc<node::Driver>) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let l = tokio::net::UnixListener::from_std(l).map_err(|e| e.to_string())?;
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(l);
        tonic::transport::Server::builder()
            .add_service(csi::identity_server::IdentityServer::new(node::Service(
                driver.clone(),
            )))
            .add_service(csi::node_server::NodeServer::new(node::Service(driver)))
            .serve_with_incoming(incoming)
            .await
            .map_err(|e| e.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_unix_sockets() {
        assert_eq!(
            endpoint_path("unix:///csi/csi.sock").ok(),
            Some(PathBuf::from("/csi/csi.sock"))
        );
        assert!(endpoint_path("tcp://0.0.0.0:1").is_err());
        assert!(endpoint_path("unix://rel").is_err());
    }
}
