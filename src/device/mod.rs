//! Devices for pods without privileged pods: the kubelet's side of the
//! device plugin API `v1beta1` (a Registration service on kubelet.sock,
//! each plugin's ListAndWatch, Allocate and PreStartContainer), and CDI
//! specs, which name what a device needs in a container.

pub mod api;
pub mod cdi;
pub mod grpc;
pub mod manager;

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

pub use manager::DeviceManager;

/// The socket plugins register on, in the plugins' directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";

/// Connections to kubelet.sock at once: a registration is one call.
const CONNECTIONS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("device plugins directory {path}: {source}")]
    Dir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("listening on {path}: {source}")]
    Listen {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Cleans the plugins' directory of sockets (as upstream: plugins watch
/// for kubelet.sock coming back, and register again) and serves the
/// Registration service on kubelet.sock until the agent ends.
pub fn serve(manager: Rc<DeviceManager>) -> Result<(), DeviceError> {
    let dir = manager.dir.clone();
    let dir_error = |source| DeviceError::Dir {
        path: dir.clone(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(dir_error)?;
    remove_sockets(&dir).map_err(dir_error)?;
    let path = dir.join(KUBELET_SOCKET);
    let listen_error = |source| DeviceError::Listen {
        path: path.clone(),
        source,
    };
    let listener = smol::net::unix::UnixListener::bind(&path).map_err(listen_error)?;
    // Whoever registers a plugin chooses what containers get: root only.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(listen_error)?;
    log::info!("device plugins register on {}", path.display());
    let handler = manager::registration_handler(manager);
    let slots = crate::server::limits::Slots::new(CONNECTIONS);
    crate::rt::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                smol::Timer::after(Duration::from_millis(200)).await;
                continue;
            };
            let Some(slot) = slots.take() else {
                continue;
            };
            let stream = crate::server::limits::IdleTimeout::new(stream, Duration::from_secs(300));
            let handler = handler.clone();
            crate::rt::spawn(async move {
                let _slot = slot;
                grpc::serve_connection(stream, handler).await;
            })
            .detach();
        }
    })
    .detach();
    Ok(())
}

/// Every socket directly in `dir`: plugins' from before, and our own.
fn remove_sockets(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type().is_ok_and(|t| t.is_socket()) {
            let path = entry.path();
            if let Err(e) = std::fs::remove_file(&path) {
                log::warn!("{}: {e}", path.display());
            }
        }
    }
    Ok(())
}
