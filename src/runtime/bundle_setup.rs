//! Everything a container instance's bundle holds before the runtime sees
//! it: the rootfs mounted, its terminationMessagePath file, subPaths
//! pinned and `config.json` written.
//!
//! The work blocks: mounts, an fsync on an SD card, and the image's user
//! database, which the image's author controls (read capped, but from a
//! rootfs that may sit on a slow disk). It is made of owned data so that it
//! runs on a helper thread, never on the loop.

use std::path::PathBuf;

use crate::cgroup;
use crate::device::api::ContainerAllocateResponse;
use crate::image::manifest::RunConfig;
use crate::pod::status::WaitingReason;
use crate::pod::{Container, Pod};
use crate::runtime::spec::devices::DeviceEdits;
use crate::runtime::spec::{self, PodPaths, SpecInput};
use crate::runtime::{Bundle, sub_path};

/// Why a bundle could not be made: the container's waiting reason, as
/// upstream reports it, and the message.
pub type SetupFailure = (WaitingReason, String);

/// What a container instance's bundle is made from.
pub struct BundleSetup {
    pub bundle: Bundle,
    pub pod: Pod,
    pub container: Container,
    /// The container's variables, resolved.
    pub env: Vec<(String, String)>,
    pub image: RunConfig,
    /// Unpacked layer directories, bottom first.
    pub layers: Vec<PathBuf>,
    /// `None` when the pod has no sandbox (it was released).
    pub paths: Option<PodPaths>,
    pub cgroups_path: String,
    pub cgroup_version: cgroup::Version,
    pub memory_capacity: u64,
    pub oom_score_floor: Option<i32>,
    pub seccomp_root: PathBuf,
    pub apparmor_default: Option<&'static str>,
    pub recursive_read_only: bool,
    /// What the container's device plugins answered for it.
    pub device_answer: ContainerAllocateResponse,
    /// Where CDI specs are, for the CDI devices it names.
    pub cdi_dirs: Vec<PathBuf>,
}

impl BundleSetup {
    /// Makes the bundle; the user its process starts as. Blocking: call
    /// it off the loop.
    pub fn run(self) -> Result<spec::User, SetupFailure> {
        let paths = self
            .paths
            .as_ref()
            .ok_or((WaitingReason::CreateContainerError, "no sandbox".to_owned()))?;
        let bundle = &self.bundle;
        let rootfs = bundle
            .mount_rootfs(&self.layers, paths.user_ns.as_ref())
            .map_err(|e| (WaitingReason::CreateContainerError, e.to_string()))?;
        let termination_log = bundle.termination_log();
        create_termination_log(&termination_log).map_err(|e| {
            (
                WaitingReason::CreateContainerError,
                format!("{}: {e}", termination_log.display()),
            )
        })?;
        let pinned_sub_paths = self
            .container
            .mounts
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let root = paths
                    .volume_sources
                    .iter()
                    .find(|(name, _)| *name == m.volume);
                match (&m.sub_path, root) {
                    (Some(sub), Some((_, root))) => {
                        let own = paths.volumes.iter().find(|(name, _)| *name == m.volume);
                        if let Some((_, own)) = own.filter(|(_, own)| own != root) {
                            sub_path::create_missing(own, sub)?;
                        }
                        let target = bundle.sub_path_target(i);
                        sub_path::pin(root, sub, &target).map(|()| Some(target))
                    }
                    _ => Ok(None),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| (WaitingReason::CreateContainerConfigError, e.to_string()))?;
        // As containerd's: CDI devices that do not resolve fail the
        // container's creation.
        let devices = DeviceEdits::resolve(&self.device_answer, &self.cdi_dirs)
            .map_err(|e| (WaitingReason::CreateContainerError, e.to_string()))?;
        let spec = spec::build(&SpecInput {
            pod: &self.pod,
            container: &self.container,
            env: &self.env,
            image: &self.image,
            rootfs: &rootfs,
            paths,
            cgroups_path: self.cgroups_path.clone(),
            cgroup_version: self.cgroup_version,
            termination_log: Some(&termination_log),
            memory_capacity: self.memory_capacity,
            oom_score_floor: self.oom_score_floor,
            seccomp_root: &self.seccomp_root,
            pinned_sub_paths: &pinned_sub_paths,
            apparmor_default: self.apparmor_default,
            recursive_read_only: self.recursive_read_only,
            devices: &devices,
        })
        .map_err(|e| (WaitingReason::CreateContainerConfigError, e.to_string()))?;
        bundle
            .write_spec(&spec)
            .map_err(|e| (WaitingReason::CreateContainerError, e.to_string()))?;
        Ok(spec.process.user)
    }
}

/// Writable by whatever user the container runs as, as upstream makes it.
fn create_termination_log(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::File::create(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
}
