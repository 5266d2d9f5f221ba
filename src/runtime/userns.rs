//! User namespaces for pods with `hostUsers: false`, as upstream's
//! UserNamespacesSupport gives them: each pod gets 65,536 host IDs of its
//! own (its root is an unprivileged host ID), taken from the node's pool
//! and kept in the pod's dir (`userns`, upstream's file and format), so that
//! they survive restarts and reboots.
//!
//! The pod's user namespace is made by `nanolet userns`, a short-lived
//! child (a process with threads cannot enter or make one), together with
//! the network, UTS and IPC namespaces it must own: a sysfs or an mqueue
//! can only be mounted, and a hostname set, from a user namespace that owns
//! the matching namespace. All four live on as bind mounts, as the sandbox's
//! other namespaces do.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sched::{CloneFlags, unshare};
use serde::{Deserialize, Serialize};

use crate::mount::{self, MountError};
use crate::state::{self, Durability, StateError};

/// IDs per pod: upstream's default (and the only value before 1.33's
/// `userNamespaces.idsPerPod`).
pub const IDS_PER_POD: u32 = 1 << 16;

/// The user the node's pool is configured for in /etc/subuid and
/// /etc/subgid, as upstream.
const POOL_USER: &str = "kubelet";

/// The namespaces a pod's user namespace comes with, in the order they are
/// bound (the user namespace first: it is what the others need).
pub const KINDS: [&str; 4] = ["user", "net", "uts", "ipc"];

/// The pod's file of mappings, in its dir.
const MAPPINGS_FILE: &str = "userns";

#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error("{path}: {reason}")]
    Pool { path: PathBuf, reason: String },
    #[error("{path}: not a mapping nanolet made: {reason}")]
    Mappings { path: PathBuf, reason: String },
    #[error("all {0} ID ranges of user namespaces are in use")]
    Exhausted(u32),
    #[error("creating the user namespace: {0}")]
    Namespace(String),
    #[error("{}", closed_dir(.0))]
    Unsearchable(PathBuf),
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> UsernsError + '_ {
    move |source| UsernsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The pod's IDs: container IDs 0..IDS_PER_POD are `host_id`.. on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    pub host_id: u32,
}

impl IdRange {
    /// The host ID of a container ID.
    pub fn host(self, container_id: u32) -> u32 {
        self.host_id + container_id
    }
}

/// The node's IDs for pods, in whole pod ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pool {
    first: u32,
    ranges: u32,
}

impl Default for Pool {
    /// Upstream's when no `kubelet` user is configured: everything above
    /// the first 65,536 IDs, which the host's own users keep.
    fn default() -> Pool {
        Pool {
            first: IDS_PER_POD,
            ranges: u32::MAX / IDS_PER_POD,
        }
    }
}

impl Pool {
    /// The pool as upstream finds it: the `kubelet` user's subordinate IDs
    /// when that user exists (the same in /etc/subuid and /etc/subgid, and
    /// in whole pod ranges), else the default.
    pub fn of_host() -> Result<Pool, UsernsError> {
        Pool::from_files(
            Path::new("/etc/passwd"),
            Path::new("/etc/subuid"),
            Path::new("/etc/subgid"),
        )
    }

    fn from_files(passwd: &Path, subuid: &Path, subgid: &Path) -> Result<Pool, UsernsError> {
        let users = fs::read_to_string(passwd).unwrap_or_default();
        let Some(uid) = users.lines().find_map(|l| {
            let mut fields = l.split(':');
            (fields.next() == Some(POOL_USER))
                .then(|| fields.nth(1))
                .flatten()
                .map(str::to_owned)
        }) else {
            return Ok(Pool::default());
        };
        let ids = |path: &Path| -> Result<(u64, u64), UsernsError> {
            let text = fs::read_to_string(path).map_err(io_at(path))?;
            let bad = |reason: String| UsernsError::Pool {
                path: path.to_owned(),
                reason,
            };
            let line = text
                .lines()
                .find(|l| {
                    let owner = l.split(':').next();
                    owner == Some(POOL_USER) || owner == Some(uid.as_str())
                })
                .ok_or_else(|| bad(format!("no IDs for user {POOL_USER}")))?;
            let mut fields = line.split(':').skip(1).map(|f| f.trim().parse::<u64>());
            match (fields.next(), fields.next()) {
                (Some(Ok(first)), Some(Ok(count))) => Ok((first, count)),
                _ => Err(bad(format!("unreadable line {line:?}"))),
            }
        };
        let (first, count) = ids(subuid)?;
        if ids(subgid)? != (first, count) {
            return Err(UsernsError::Pool {
                path: subgid.to_owned(),
                reason: format!(
                    "the IDs of {POOL_USER} differ from those in {}",
                    subuid.display()
                ),
            });
        }
        let per_pod = u64::from(IDS_PER_POD);
        if first % per_pod != 0 || count % per_pod != 0 || count == 0 {
            return Err(UsernsError::Pool {
                path: subuid.to_owned(),
                reason: format!(
                    "{POOL_USER}'s IDs {first}+{count} are not whole ranges of {per_pod}"
                ),
            });
        }
        let end = (first + count).min(1 << 32);
        Ok(Pool {
            first: u32::try_from(first).unwrap_or(u32::MAX),
            ranges: u32::try_from(end.saturating_sub(first) / per_pod).unwrap_or(0),
        })
    }

    fn range(self, index: u32) -> IdRange {
        IdRange {
            host_id: self.first + index * IDS_PER_POD,
        }
    }

    fn index(self, range: IdRange) -> Option<u32> {
        let offset = range.host_id.checked_sub(self.first)?;
        (offset % IDS_PER_POD == 0 && offset / IDS_PER_POD < self.ranges)
            .then_some(offset / IDS_PER_POD)
    }
}

/// One mapping as upstream's `userns` file has it.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct IdMapping {
    host_id: u32,
    container_id: u32,
    length: u32,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Mappings {
    uid_mappings: Vec<IdMapping>,
    gid_mappings: Vec<IdMapping>,
}

/// The pod's range, if it has one.
pub fn recorded(pod_dir: &Path) -> Result<Option<IdRange>, UsernsError> {
    let path = pod_dir.join(MAPPINGS_FILE);
    let text = match fs::read(&path) {
        Ok(text) => text,
        // No record, or no pod dir (a stray file among them).
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(io_at(&path)(e)),
    };
    let bad = |reason: String| UsernsError::Mappings {
        path: path.clone(),
        reason,
    };
    let mappings: Mappings = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    match (&mappings.uid_mappings[..], &mappings.gid_mappings[..]) {
        ([uid], [gid]) if uid == gid && uid.container_id == 0 && uid.length == IDS_PER_POD => {
            Ok(Some(IdRange {
                host_id: uid.host_id,
            }))
        }
        _ => Err(bad(
            "one range of 65536 IDs from 0, the same for users and groups".into(),
        )),
    }
}

/// The pod's range: the one it was given, else the first free one of the
/// pool, recorded before it is used. Free means no pod dir under
/// `pods_dir` names it, so a range is free again once its pod's dir is
/// gone.
pub async fn allocate(pods_dir: &Path, pod_dir: &Path, pool: Pool) -> Result<IdRange, UsernsError> {
    if let Some(range) = recorded(pod_dir)? {
        return Ok(range);
    }
    // From the scan to the claim there is no await: no other pod can take
    // the same range in between.
    let mut used = BTreeSet::new();
    for entry in fs::read_dir(pods_dir).map_err(io_at(pods_dir))?.flatten() {
        // An unreadable record stops this: skipping it could hand its
        // pod's IDs to a second pod.
        if let Some(range) = recorded(&entry.path())? {
            used.extend(pool.index(range));
        }
    }
    let index = (0..pool.ranges)
        .find(|i| !used.contains(i))
        .ok_or(UsernsError::Exhausted(pool.ranges))?;
    let range = pool.range(index);
    record(pod_dir, range, Durability::ProcessCrash)?;
    // Made to last a power cut before the range is used, off the loop
    // (fsync is slow on SD cards).
    let dir = pod_dir.to_owned();
    crate::helpers::unblock(move || record(&dir, range, Durability::PowerLoss)).await?;
    Ok(range)
}

/// Writes the pod's `userns` file.
fn record(pod_dir: &Path, range: IdRange, durability: Durability) -> Result<(), StateError> {
    let mapping = || {
        vec![IdMapping {
            host_id: range.host_id,
            container_id: 0,
            length: IDS_PER_POD,
        }]
    };
    let mappings = Mappings {
        uid_mappings: mapping(),
        gid_mappings: mapping(),
    };
    state::write_json(&pod_dir.join(MAPPINGS_FILE), &mappings, 0o600, durability)
}

/// Entry point of `nanolet userns <hostname>`: makes a user namespace with
/// the network, UTS and IPC namespaces it owns, names the host and brings
/// up the loopback, says `ready` and waits for its stdin to close, by which
/// time the agent has written the ID maps and bound the namespaces. Must
/// run before any thread is started.
pub fn run(hostname: &str) -> io::Result<()> {
    unshare(
        CloneFlags::CLONE_NEWUSER
            | CloneFlags::CLONE_NEWNET
            | CloneFlags::CLONE_NEWUTS
            | CloneFlags::CLONE_NEWIPC,
    )
    .map_err(io::Error::from)?;
    // All capabilities in the new namespace are there before any mapping.
    nix::unistd::sethostname(hostname).map_err(io::Error::from)?;
    super::netns::loopback_up()?;
    let mut stdout = io::stdout();
    writeln!(stdout, "ready")?;
    stdout.flush()?;
    io::copy(&mut io::stdin(), &mut io::sink())?;
    Ok(())
}

/// Whether pods with `hostUsers: false` can run here: `dir` (where the
/// layers and disk volumes are) and tmpfs (memory volumes, Secrets) must
/// allow ID-mapped mounts, which a throwaway user namespace from
/// `nanolet userns` tries. The error says what failed.
pub async fn probe(dir: &Path, executable: &Path) -> Result<(), String> {
    if let Some(closed) = unsearchable_above(dir) {
        return Err(closed_dir(&closed));
    }
    // Any range: the kernel maps no mount into a namespace without one.
    let range = IdRange {
        host_id: IDS_PER_POD,
    };
    let mut child = start(executable, "probe", range)
        .await
        .map_err(|e| e.to_string())?;
    let ns = fs::File::open(format!("/proc/{}/ns/user", child.id()));
    // Its end closes the child's stdin, and it exits.
    drop(child.stdin.take());
    let _ = child.status().await;
    let ns = ns.map_err(|e| format!("opening the user namespace: {e}"))?;
    // A state dir not made yet would be made on its parent's filesystem.
    let existing = dir.ancestors().find(|d| d.exists()).unwrap_or(dir);
    mount::can_idmap(existing, std::os::fd::AsFd::as_fd(&ns)).map_err(|e| e.to_string())
}

fn closed_dir(dir: &Path) -> String {
    format!(
        "{} is not searchable by others (chmod o+x): runc reaches the rootfs through it from inside the pod's user namespace",
        dir.display()
    )
}

/// Starts `nanolet userns <hostname>` and maps its namespace to `range`;
/// it waits, holding the namespaces, until its stdin is closed.
async fn start(
    executable: &Path,
    hostname: &str,
    range: IdRange,
) -> Result<async_process::Child, UsernsError> {
    let fail = |message: String| UsernsError::Namespace(message);
    let (mut child, line) = super::start_helper(
        executable,
        &["userns".as_ref(), hostname.as_ref()],
        Stdio::piped(),
        Stdio::piped(),
    )
    .await
    .map_err(fail)?;
    if line.trim() != "ready" {
        drop(child.stdin.take());
        let output = child.output().await.map_err(|e| fail(e.to_string()))?;
        return Err(fail(format!(
            "nanolet userns exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let map = format!("0 {} {IDS_PER_POD}\n", range.host_id);
    for file in ["uid_map", "gid_map"] {
        let path = PathBuf::from(format!("/proc/{}/{file}", child.id()));
        fs::write(&path, &map).map_err(io_at(&path))?;
    }
    Ok(child)
}

/// Makes the pod's user namespace and the namespaces it owns (see
/// [`run`]), mapped to `range`, bound at `ns_dir/<kind>` for [`KINDS`].
/// What was bound before is unbound first: the four belong together.
pub async fn create(
    ns_dir: &Path,
    range: IdRange,
    hostname: &str,
    executable: &Path,
) -> Result<(), UsernsError> {
    unbind(ns_dir)?;
    let mut child = start(executable, hostname, range).await?;
    let bound = bind_all(ns_dir, child.id());
    if bound.is_err() {
        let _ = unbind(ns_dir);
    }
    // Its end closes the child's stdin; it then exits, and the namespaces
    // live on in their mounts.
    drop(child.stdin.take());
    let _ = child.status().await;
    bound
}

fn bind_all(ns_dir: &Path, pid: u32) -> Result<(), UsernsError> {
    for kind in KINDS {
        let target = ns_dir.join(kind);
        fs::File::create(&target).map_err(io_at(&target))?;
        mount::bind(Path::new(&format!("/proc/{pid}/ns/{kind}")), &target)?;
    }
    Ok(())
}

/// Unbinds the pod's namespaces; safe to repeat.
pub fn unbind(ns_dir: &Path) -> Result<(), UsernsError> {
    for kind in KINDS {
        let path = ns_dir.join(kind);
        mount::unmount(&path)?;
        let _ = fs::remove_file(&path);
    }
    Ok(())
}

/// Where [`PodUserNs::mapped`] stages a pod's image layers, under its dir:
/// image GC reads overlays' lower dirs from here as the layers they are.
pub const MAPPED_LAYERS: &str = "idmapped/layers";

/// A pod's own user namespace, as its containers are set up in it.
#[derive(Debug, Clone, PartialEq)]
pub struct PodUserNs {
    pub range: IdRange,
    /// The pod's dir.
    pub pod_dir: PathBuf,
}

impl PodUserNs {
    /// The namespace's bind mount, with the sandbox's others.
    pub fn path(&self) -> PathBuf {
        self.pod_dir.join("ns").join("user")
    }

    /// `source` as the pod's processes must see it (what root owns on disk,
    /// the pod's root owns): an ID-mapped mount of it, made once, at
    /// `idmapped/<kind>/<name>` in the pod's dir. runc 1.1 cannot map
    /// mounts itself; its containers get these as their sources.
    pub fn mapped(&self, kind: &str, name: &str, source: &Path) -> Result<PathBuf, UsernsError> {
        let target = self.pod_dir.join("idmapped").join(kind).join(name);
        // Only a mount of the source shows its inode there (no scan of
        // mountinfo per layer). Anything else is remade: nothing mounted
        // yet, or a source replaced since (a layer collected and pulled
        // again).
        if same_file(&target, source) {
            return Ok(target);
        }
        mount::unmount(&target)?;
        let is_dir = fs::metadata(source).map_err(io_at(source))?.is_dir();
        if is_dir {
            fs::create_dir_all(&target).map_err(io_at(&target))?;
        } else {
            if let Some(parent) = target.parent() {
                fs::create_dir_all(parent).map_err(io_at(parent))?;
            }
            fs::File::create(&target).map_err(io_at(&target))?;
        }
        mount::bind_idmapped(source, &target, &self.path())?;
        Ok(target)
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    }
}

/// The first dir above `state_dir` that others may not search, if any: runc
/// reaches a container's rootfs through it from inside the pod's user
/// namespace. The agent opens its own dirs (see [`allow_traversal`]), never
/// the admin's.
pub fn unsearchable_above(state_dir: &Path) -> Option<PathBuf> {
    state_dir
        .ancestors()
        .skip(1)
        .filter_map(|dir| Some((dir, fs::metadata(dir).ok()?)))
        .find(|(_, metadata)| metadata.permissions().mode() & 0o001 == 0)
        .map(|(dir, _)| dir.to_owned())
}

/// Lets the pod's processes, whose root is not the host's, look up paths
/// through `dir` (not list it): runc reaches a container's rootfs from
/// inside the pod's user namespace.
pub fn allow_traversal(dir: &Path) -> Result<(), UsernsError> {
    let metadata = fs::metadata(dir).map_err(io_at(dir))?;
    let mode = metadata.permissions().mode();
    if mode & 0o011 != 0o011 {
        fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o011)).map_err(io_at(dir))?;
    }
    Ok(())
}

/// Opens a pod's own dir to that pod's root alone: group-owned by the
/// range's first ID (the pod's root gid on the host), 0710. The state dir
/// and `pods/` above it are searchable by others for every such pod's
/// root; this dir keeps host users out of the pod's volumes (Secrets) and
/// its ID-mapped mounts, whatever path they learn from mountinfo.
pub fn open_to_pod_root(dir: &Path, range: IdRange) -> Result<(), UsernsError> {
    nix::unistd::chown(dir, None, Some(nix::unistd::Gid::from_raw(range.host_id)))
        .map_err(|e| io_at(dir)(e.into()))?;
    fs::set_permissions(dir, fs::Permissions::from_mode(0o710)).map_err(io_at(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::TestDir;
    use futures_lite::future::block_on;

    #[test]
    fn the_pool_is_upstreams_default_or_the_kubelet_users_ids() {
        let dir = TestDir::new("userns-pool");
        let (passwd, subuid, subgid) = (
            dir.0.join("passwd"),
            dir.0.join("subuid"),
            dir.0.join("subgid"),
        );
        fs::write(&passwd, "root:x:0:0::/root:/bin/sh\n").unwrap();
        let pool = Pool::from_files(&passwd, &subuid, &subgid).unwrap();
        assert_eq!(pool, Pool::default());
        assert_eq!(pool.range(0).host_id, 65536);
        assert_eq!(pool.ranges, 65535);

        fs::write(
            &passwd,
            "root:x:0:0::/root:/bin/sh\nkubelet:x:999:999::/:/bin/false\n",
        )
        .unwrap();
        fs::write(&subuid, "alice:100000:65536\nkubelet:524288:131072\n").unwrap();
        fs::write(&subgid, "999:524288:131072\n").unwrap();
        let pool = Pool::from_files(&passwd, &subuid, &subgid).unwrap();
        assert_eq!((pool.first, pool.ranges), (524288, 2));

        fs::write(&subgid, "kubelet:589824:131072\n").unwrap();
        let err = Pool::from_files(&passwd, &subuid, &subgid).unwrap_err();
        assert!(err.to_string().contains("differ"), "{err}");
        fs::write(&subuid, "kubelet:100000:65536\n").unwrap();
        fs::write(&subgid, "kubelet:100000:65536\n").unwrap();
        let err = Pool::from_files(&passwd, &subuid, &subgid).unwrap_err();
        assert!(err.to_string().contains("whole ranges"), "{err}");
    }

    #[test]
    fn a_dir_above_the_state_dir_that_others_cannot_search_is_named() {
        let dir = TestDir::new("userns-search");
        let closed = dir.0.join("closed");
        let state = closed.join("open/state");
        fs::create_dir_all(&state).unwrap();
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o755)).unwrap();
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unsearchable_above(&state), Some(closed.clone()));
        // The state dir's own mode is the agent's to set.
        fs::set_permissions(&closed, fs::Permissions::from_mode(0o711)).unwrap();
        fs::set_permissions(&state, fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(unsearchable_above(&state), None);
        assert_eq!(unsearchable_above(&state.join("not/made/yet")), Some(state));
    }

    #[test]
    fn ranges_are_kept_per_pod_and_free_again_when_its_dir_goes() {
        let dir = TestDir::new("userns-allocate");
        let pods = &dir.0;
        let pod = |name: &str| {
            let path = pods.join(name);
            fs::create_dir_all(&path).unwrap();
            path
        };
        let pool = Pool {
            first: 1 << 20,
            ranges: 2,
        };
        let (a, b, c) = (pod("a"), pod("b"), pod("c"));
        let first = block_on(allocate(pods, &a, pool)).unwrap();
        assert_eq!(first.host_id, 1 << 20);
        assert_eq!(block_on(allocate(pods, &a, pool)).unwrap(), first);
        let second = block_on(allocate(pods, &b, pool)).unwrap();
        assert_eq!(second.host_id, (1 << 20) + 65536);
        assert_eq!(second.host(1000), (1 << 20) + 66536);
        assert!(matches!(
            block_on(allocate(pods, &c, pool)),
            Err(UsernsError::Exhausted(2))
        ));
        // A stray file among the pod dirs is no pod.
        fs::write(pods.join("stray"), "").unwrap();
        assert_eq!(recorded(&pods.join("stray")).unwrap(), None);
        // Upstream's file, as its kubelet writes it.
        let text = fs::read_to_string(a.join(MAPPINGS_FILE)).unwrap();
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            value["uidMappings"][0],
            serde_json::json!({"hostId": 1 << 20, "containerId": 0, "length": 65536})
        );
        fs::remove_dir_all(&a).unwrap();
        assert_eq!(block_on(allocate(pods, &c, pool)).unwrap(), first);

        fs::write(b.join(MAPPINGS_FILE), "{\"uidMappings\": []}").unwrap();
        assert!(recorded(&b).is_err());
    }
}
