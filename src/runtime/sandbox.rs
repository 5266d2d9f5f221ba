//! The pod sandbox without a pause container: the pod's shared network, UTS
//! and IPC namespaces live on as bind mounts under the pod's state dir (a
//! shared PID namespace needs a process: see `pause`), and
//! the pod's /etc/hosts, /etc/resolv.conf, /etc/hostname and volumes are
//! prepared there. Creation and teardown are idempotent, so either may be
//! repeated after a crash.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, unshare};

use super::cni::{self, Attachment, Cni, CniError};
use super::pause;
use super::spec::PodPaths;
use super::userns::{self, PodUserNs, UsernsError};
use crate::mount::{self, MountError};
use crate::pod::{DnsConfig, DnsPolicy, HostPathKind, Pod, VolumeSource};

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    #[error("creating namespaces: {0}")]
    Namespace(String),
    #[error(
        "failed to construct FQDN from pod hostname and cluster domain, FQDN {fqdn} is too long (64 characters is the max, {} characters requested)",
        fqdn.len()
    )]
    FqdnTooLong { fqdn: String },
    #[error(transparent)]
    Network(#[from] CniError),
    #[error(transparent)]
    UserNamespace(#[from] UsernsError),
    #[error("creating namespaces: {0}")]
    Pause(#[from] pause::PauseError),
    #[error(
        "hostPort needs a CNI network with the portmap plugin, and {0} has no network configuration"
    )]
    NoNetworkForHostPort(PathBuf),
    #[error("volume {volume}: hostPath {path}: {reason}")]
    HostPath {
        volume: String,
        path: String,
        reason: String,
    },
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        path: path.to_owned(),
        source,
    }
}

const NAMESPACES: [(&str, CloneFlags); 3] = [
    ("net", CloneFlags::CLONE_NEWNET),
    ("uts", CloneFlags::CLONE_NEWUTS),
    ("ipc", CloneFlags::CLONE_NEWIPC),
];

/// Which of the pod's namespaces are its own (not the host's).
fn own_namespaces(pod: &Pod) -> Vec<&'static str> {
    let mut kinds = Vec::new();
    if !pod.host_network {
        // A hostNetwork pod also keeps the host's name, as upstream.
        kinds.push("net");
        kinds.push("uts");
    }
    if !pod.host_ipc {
        kinds.push("ipc");
    }
    kinds
}

/// The cluster's DNS, for pods with dnsPolicy ClusterFirst.
#[derive(Debug, Clone, Default)]
pub struct ClusterDns {
    pub servers: Vec<std::net::IpAddr>,
    pub domain: String,
}

/// Upstream's cap on search domains (glibc's since 2.26).
const MAX_SEARCH: usize = 32;

/// The pod's resolv.conf by its dnsPolicy, as upstream builds it: the
/// cluster's nameservers with the `<ns>.svc.<domain> svc.<domain> <domain>`
/// search path (then the host's) and `ndots:5` for ClusterFirst off the
/// host network and for ClusterFirstWithHostNet; the host's file for
/// Default (and when no cluster DNS is configured, as upstream falls back);
/// nothing for None. The pod's dnsConfig is then merged in: nameservers and
/// search domains appended, options replaced by name.
pub fn resolv_conf_text(pod: &Pod, dns: &ClusterDns, host: &str) -> String {
    let cluster = match pod.dns_policy {
        DnsPolicy::ClusterFirst => !pod.host_network,
        DnsPolicy::ClusterFirstWithHostNet => true,
        DnsPolicy::Default | DnsPolicy::None => false,
    } && !dns.servers.is_empty();
    if !cluster && pod.dns_policy != DnsPolicy::None && pod.dns_config.is_none() {
        return host.to_owned();
    }
    let host_conf = parse_resolv_conf(host);
    let mut conf = if pod.dns_policy == DnsPolicy::None {
        DnsConfig::default()
    } else if cluster {
        let domain = &dns.domain;
        let mut searches = vec![
            format!("{}.svc.{domain}", pod.namespace),
            format!("svc.{domain}"),
            domain.clone(),
        ];
        searches.extend(host_conf.searches);
        DnsConfig {
            nameservers: dns.servers.iter().map(|s| s.to_string()).collect(),
            searches,
            options: vec![("ndots".into(), Some("5".into()))],
        }
    } else {
        host_conf
    };
    if let Some(extra) = &pod.dns_config {
        conf.nameservers.extend(extra.nameservers.iter().cloned());
        conf.searches.extend(extra.searches.iter().cloned());
        for (name, value) in &extra.options {
            match conf.options.iter_mut().find(|(n, _)| n == name) {
                Some(existing) => existing.1 = value.clone(),
                None => conf.options.push((name.clone(), value.clone())),
            }
        }
    }
    let mut seen = std::collections::HashSet::new();
    conf.nameservers.retain(|n| seen.insert(n.clone()));
    conf.nameservers.truncate(MAX_NAMESERVERS);
    let mut seen = std::collections::HashSet::new();
    conf.searches.retain(|n| seen.insert(n.clone()));
    conf.searches.truncate(MAX_SEARCH);
    let mut text = String::new();
    for server in &conf.nameservers {
        text.push_str(&format!("nameserver {server}\n"));
    }
    if !conf.searches.is_empty() {
        text.push_str(&format!("search {}\n", conf.searches.join(" ")));
    }
    if !conf.options.is_empty() {
        let options: Vec<String> = conf
            .options
            .iter()
            .map(|(n, v)| match v {
                Some(v) => format!("{n}:{v}"),
                None => n.clone(),
            })
            .collect();
        text.push_str(&format!("options {}\n", options.join(" ")));
    }
    text
}

/// glibc reads at most three nameservers.
const MAX_NAMESERVERS: usize = 3;

fn parse_resolv_conf(text: &str) -> DnsConfig {
    let mut conf = DnsConfig::default();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("nameserver") => conf.nameservers.extend(words.next().map(str::to_owned)),
            // The last of search/domain wins, as in glibc.
            Some("search" | "domain") => conf.searches = words.map(str::to_owned).collect(),
            Some("options") => conf.options.extend(words.map(|o| match o.split_once(':') {
                Some((n, v)) => (n.to_owned(), Some(v.to_owned())),
                None => (o.to_owned(), None),
            })),
            _ => {}
        }
    }
    conf
}

/// The pod's own host name: with `setHostnameAsFQDN` and a subdomain its
/// fully qualified name, as upstream (at most 64 bytes, the kernel's).
fn uts_hostname(pod: &Pod, dns: &ClusterDns) -> Result<String, SandboxError> {
    match &pod.subdomain {
        Some(sub) if pod.set_hostname_as_fqdn && !pod.host_network => {
            let fqdn = format!(
                "{}.{sub}.{}.svc.{}",
                pod.hostname, pod.namespace, dns.domain
            );
            if fqdn.len() > 64 {
                return Err(SandboxError::FqdnTooLong { fqdn });
            }
            Ok(fqdn)
        }
        _ => Ok(pod.hostname.clone()),
    }
}

pub async fn create(
    pod: &Pod,
    pod_dir: &Path,
    dns: &ClusterDns,
    network: &Cni,
    executable: &Path,
) -> Result<PodPaths, SandboxError> {
    let own_hostname = uts_hostname(pod, dns)?;
    let ns_dir = pod_dir.join("ns");
    fs::create_dir_all(&ns_dir).map_err(io_at(&ns_dir))?;
    let kinds = own_namespaces(pod);
    let user_ns = if pod.host_users {
        None
    } else {
        Some(user_namespace(pod_dir).await?)
    };
    let mounted = mount::mounts_under(&ns_dir);
    let is_mounted = |kind: &str| mounted.contains(&ns_dir.join(kind));
    let (new_net, new_namespaces) = match &user_ns {
        Some(user_ns) => {
            let whole = userns::KINDS.iter().all(|k| is_mounted(k));
            if !whole {
                // A pause in the namespaces' old user namespace could not
                // be joined from the new one.
                pause::stop(&ns_dir)?;
                userns::create(&ns_dir, user_ns.range, &own_hostname, executable).await?;
            }
            (!whole, !whole)
        }
        None => {
            let missing: Vec<&'static str> =
                kinds.iter().copied().filter(|k| !is_mounted(k)).collect();
            let new_net = missing.contains(&"net");
            let new_namespaces = !missing.is_empty();
            if !missing.is_empty() {
                make_namespaces(ns_dir.clone(), own_hostname.clone(), missing).await?;
            }
            (new_net, new_namespaces)
        }
    };
    let ns_path = |kind: &str| kinds.contains(&kind).then(|| ns_dir.join(kind));
    let new_pause = pod.share_process_namespace
        && pause::ensure(
            &ns_dir,
            executable,
            user_ns.as_ref().map(PodUserNs::path).as_deref(),
        )
        .await?;
    // A pod on the host's namespaces has nothing that shows a reboot but
    // the boot id.
    let rebooted = new_boot(&ns_dir)?;
    // Kept until the worker has acted on it: a later step failing (the
    // network, at boot) or a crash must not lose it.
    let pending = ns_dir.join(RECREATED);
    if new_namespaces || new_pause || rebooted {
        write(&pending, b"")?;
    }
    let recreated = pending.exists();
    let pod_ips = match ns_path("net") {
        Some(netns) => attach(pod, pod_dir, network, netns, new_net).await?,
        None => Vec::new(),
    };

    let etc = pod_dir.join("etc");
    fs::create_dir_all(&etc).map_err(io_at(&etc))?;
    let hosts = etc.join("hosts");
    let resolv_conf = etc.join("resolv.conf");
    let hostname = etc.join("hostname");
    let (mut hosts_text, hostname_text) = if pod.host_network {
        let host_name = nix::unistd::gethostname()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_default();
        (
            fs::read_to_string("/etc/hosts").unwrap_or_default(),
            host_name,
        )
    } else {
        // With a subdomain the pod also has its FQDN, as upstream writes it.
        let names = match &pod.subdomain {
            Some(sub) => format!(
                "{}.{sub}.{}.svc.{}\t{}",
                pod.hostname, pod.namespace, dns.domain, pod.hostname
            ),
            None => pod.hostname.clone(),
        };
        let entries: Vec<(String, String)> = pod_ips
            .iter()
            .map(|ip| (ip.to_string(), names.clone()))
            .collect();
        (managed_hosts(&entries), own_hostname.clone())
    };
    if !pod.host_aliases.is_empty() {
        hosts_text.push_str("\n# Entries added by HostAliases.\n");
        for (ip, names) in &pod.host_aliases {
            hosts_text.push_str(&format!("{ip}\t{}\n", names.join("\t")));
        }
    }
    write(&hosts, hosts_text.as_bytes())?;
    write(&hostname, format!("{hostname_text}\n").as_bytes())?;
    let host_resolv = fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    write(
        &resolv_conf,
        resolv_conf_text(pod, dns, &host_resolv).as_bytes(),
    )?;

    let mut volumes = Vec::new();
    for volume in &pod.volumes {
        let path = match &volume.source {
            VolumeSource::EmptyDir { memory, size_limit } => {
                let dir = pod_dir.join("volumes").join(&volume.name);
                fs::create_dir_all(&dir).map_err(io_at(&dir))?;
                if *memory && !mount::is_mounted(&dir) {
                    // Sized as upstream: the sizeLimit, else the pod's
                    // memory limit, else tmpfs's default (half the RAM).
                    let size = size_limit.or(pod.pod_limit(|c| c.resources.memory_limit));
                    let options = match size {
                        Some(bytes) => format!("mode=0777,size={bytes}"),
                        None => "mode=0777".to_owned(),
                    };
                    mount::tmpfs_with(&dir, &options)?;
                }
                share_volume_dir(&dir, pod.fs_group)?;
                dir
            }
            VolumeSource::HostPath { path, kind } => {
                check_host_path(&volume.name, path, *kind)?;
                PathBuf::from(path)
            }
            // The pod worker reports it and starts no container.
            VolumeSource::Unsupported { .. } => continue,
            // Filled by the pod worker from the API objects it reads.
            VolumeSource::Projected(_) => {
                let dir = pod_dir.join("volumes").join(&volume.name);
                fs::create_dir_all(&dir).map_err(io_at(&dir))?;
                if !mount::is_mounted(&dir) {
                    mount::tmpfs(&dir)?;
                }
                dir
            }
        };
        volumes.push((volume.name.clone(), path));
    }
    let mut volume_sources = volumes.clone();
    let (hosts, resolv_conf, hostname) = match &user_ns {
        // What the agent writes, the pod's root owns.
        Some(user_ns) => {
            let etc = user_ns.mapped("pod", "etc", &etc)?;
            for (name, path) in &mut volume_sources {
                *path = user_ns.mapped("volumes", name, path)?;
            }
            (
                etc.join("hosts"),
                etc.join("resolv.conf"),
                etc.join("hostname"),
            )
        }
        None => (hosts, resolv_conf, hostname),
    };
    Ok(PodPaths {
        net_ns: ns_path("net"),
        uts_ns: ns_path("uts"),
        ipc_ns: ns_path("ipc"),
        pid_ns: pod.share_process_namespace.then(|| ns_dir.join("pid")),
        user_ns,
        recreated,
        hosts,
        resolv_conf,
        hostname,
        own_hostname,
        volumes,
        volume_sources,
        pod_ips,
    })
}

/// The pod's user namespace as its containers use it: its IDs (given once,
/// kept in the pod's dir), and the state dirs down to the pod's opened to
/// the pod's root, which runc needs to reach the rootfs through them.
async fn user_namespace(pod_dir: &Path) -> Result<PodUserNs, SandboxError> {
    let pods_dir = pod_dir.parent().unwrap_or(Path::new("/"));
    let range = match userns::recorded(pod_dir)? {
        Some(range) => range,
        None => userns::allocate(pods_dir, pod_dir, userns::Pool::of_host()?).await?,
    };
    let state_dir = pods_dir.parent().unwrap_or(Path::new("/"));
    if let Some(closed) = userns::unsearchable_above(state_dir) {
        return Err(UsernsError::Unsearchable(closed).into());
    }
    userns::allow_traversal(state_dir)?;
    userns::allow_traversal(pods_dir)?;
    userns::open_to_pod_root(pod_dir, range)?;
    Ok(PodUserNs {
        range,
        pod_dir: pod_dir.to_owned(),
    })
}

/// Marks a sandbox made anew until [`recreation_handled`].
const RECREATED: &str = "recreated";

/// The worker has recorded what a new sandbox means for the pod's
/// containers.
pub fn recreation_handled(pod_dir: &Path) -> Result<(), SandboxError> {
    let path = pod_dir.join("ns").join(RECREATED);
    match fs::remove_file(&path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(SandboxError::Io { path, source: e }),
        _ => Ok(()),
    }
}

/// Whether the machine booted since the sandbox was last made; records
/// this boot. A sandbox with no boot recorded (made by an older nanolet)
/// counts as made in this boot.
fn new_boot(ns_dir: &Path) -> Result<bool, SandboxError> {
    let current = fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let marker = ns_dir.join("boot_id");
    let previous = fs::read_to_string(&marker).ok();
    if previous.as_deref() == Some(current.as_str()) {
        return Ok(false);
    }
    write(&marker, current.as_bytes())?;
    Ok(previous.is_some())
}

async fn attach(
    pod: &Pod,
    pod_dir: &Path,
    network: &Cni,
    netns: PathBuf,
    new_namespace: bool,
) -> Result<Vec<std::net::IpAddr>, SandboxError> {
    let port_mappings = cni::port_mappings(pod);
    let Some((_, list)) = network.network()? else {
        if !port_mappings.is_empty() {
            return Err(SandboxError::NoNetworkForHostPort(network.conf_dir.clone()));
        }
        if new_namespace {
            // Attached before a reboot, to a network since removed.
            network.detach(pod_dir).await?;
        }
        return Ok(Vec::new());
    };
    let attachment = Attachment {
        container_id: pod.uid.clone(),
        netns,
        args: cni::pod_args(pod),
        port_mappings,
    };
    Ok(network
        .attach(pod_dir, &list, &attachment, new_namespace)
        .await?)
}

fn write(path: &Path, data: &[u8]) -> Result<(), SandboxError> {
    Ok(crate::state::write_atomic(
        path,
        data,
        0o644,
        crate::state::Durability::ProcessCrash,
    )?)
}

/// The kubelet-managed hosts file.
fn managed_hosts(pod_ips: &[(String, String)]) -> String {
    let mut text = String::from(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n",
    );
    for (ip, name) in pod_ips {
        text.push_str(&format!("{ip}\t{name}\n"));
    }
    text
}

/// emptyDir is writable by every user of the pod (0777, as upstream); with
/// fsGroup it belongs to that group, which new files inherit (setgid).
fn share_volume_dir(dir: &Path, fs_group: Option<u32>) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    let mut mode = 0o777;
    if let Some(gid) = fs_group {
        std::os::unix::fs::chown(dir, None, Some(gid)).map_err(io_at(dir))?;
        mode |= 0o2000;
    }
    fs::set_permissions(dir, fs::Permissions::from_mode(mode)).map_err(io_at(dir))
}

fn check_host_path(volume: &str, path: &str, kind: HostPathKind) -> Result<(), SandboxError> {
    let err = |reason: &str| SandboxError::HostPath {
        volume: volume.to_owned(),
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let meta = fs::metadata(path);
    use std::os::unix::fs::FileTypeExt;
    let is = |check: fn(&fs::FileType) -> bool, what: &str| match &meta {
        Ok(m) if check(&m.file_type()) => Ok(()),
        _ => Err(err(what)),
    };
    match kind {
        HostPathKind::Unchecked => Ok(()),
        HostPathKind::Socket => is(fs::FileType::is_socket, "is not a socket"),
        HostPathKind::CharDevice => is(fs::FileType::is_char_device, "is not a character device"),
        HostPathKind::BlockDevice => is(fs::FileType::is_block_device, "is not a block device"),
        HostPathKind::Directory => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            _ => Err(err("is not a directory")),
        },
        HostPathKind::File => match meta {
            Ok(m) if m.is_file() => Ok(()),
            _ => Err(err("is not a file")),
        },
        HostPathKind::DirectoryOrCreate => match meta {
            Ok(m) if m.is_dir() => Ok(()),
            Ok(_) => Err(err("exists and is not a directory")),
            Err(_) => {
                use std::os::unix::fs::DirBuilderExt;
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(path)
                    .map_err(|e| err(&e.to_string()))
            }
        },
        HostPathKind::FileOrCreate => match meta {
            Ok(m) if m.is_file() => Ok(()),
            Ok(_) => Err(err("exists and is not a file")),
            Err(_) => fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map(drop)
                .map_err(|e| err(&e.to_string())),
        },
    }
}

/// Creates the namespaces on a thread of their own: unshare(2) moves the
/// calling thread, which must then end rather than go back to the loop or
/// to a pool.
async fn make_namespaces(
    ns_dir: PathBuf,
    hostname: String,
    kinds: Vec<&'static str>,
) -> Result<(), SandboxError> {
    super::netns::on_own_thread("nanolet-netns", move || {
        namespaces_on_this_thread(&ns_dir, &hostname, &kinds)
    })
    .await
    .map_err(|e| SandboxError::Namespace(e.to_string()))?
}

fn namespaces_on_this_thread(
    ns_dir: &Path,
    hostname: &str,
    kinds: &[&'static str],
) -> Result<(), SandboxError> {
    let flags = NAMESPACES
        .iter()
        .filter(|(k, _)| kinds.contains(k))
        .fold(CloneFlags::empty(), |acc, (_, f)| acc | *f);
    unshare(flags).map_err(|e| SandboxError::Namespace(format!("unshare: {e}")))?;
    if kinds.contains(&"uts") {
        nix::unistd::sethostname(hostname)
            .map_err(|e| SandboxError::Namespace(format!("sethostname: {e}")))?;
    }
    if kinds.contains(&"net") {
        super::netns::loopback_up()
            .map_err(|e| SandboxError::Namespace(format!("bringing up lo: {e}")))?;
    }
    let tid = nix::unistd::gettid();
    for kind in kinds {
        let target = ns_dir.join(kind);
        fs::File::create(&target).map_err(io_at(&target))?;
        let source = PathBuf::from(format!("/proc/self/task/{tid}/ns/{kind}"));
        mount::bind(&source, &target)?;
    }
    Ok(())
}

/// Undoes [`create`]: detaches the pod from its network, unmounts the
/// namespaces (the kernel frees them when their last user is gone) and
/// whatever else is still mounted in the pod's dir. Safe to repeat; the
/// mounts go even when the network plugins fail.
pub async fn teardown(pod_dir: &Path, network: &Cni) -> Result<(), SandboxError> {
    let detached = match network.detach(pod_dir).await {
        Ok(()) => Ok(()),
        // The pod's dir goes; its attachment's record must not.
        Err(e) => network.park(pod_dir).and(Err(e)),
    };
    pause::stop(&pod_dir.join("ns"))?;
    for kind in ["net", "uts", "ipc", "user"] {
        let path = pod_dir.join("ns").join(kind);
        mount::unmount(&path)?;
        let _ = fs::remove_file(&path);
    }
    for leftover in mount::mounts_under(pod_dir) {
        mount::unmount(&leftover)?;
    }
    Ok(detached?)
}

#[cfg(test)]
mod dns_tests {
    use super::*;

    fn pod(extra: &str) -> Pod {
        crate::pod::manifest::parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, namespace: shop}}\nspec:\n{extra}  containers:\n  - name: c\n    image: i:1\n"
        ))
    }

    #[test]
    fn host_name_as_fqdn_within_the_kernels_64_bytes() {
        let dns = ClusterDns {
            servers: Vec::new(),
            domain: "cluster.local".into(),
        };
        let fqdn = "  subdomain: web\n  setHostnameAsFQDN: true\n";
        assert_eq!(
            uts_hostname(&pod(fqdn), &dns).unwrap(),
            "p.web.shop.svc.cluster.local"
        );
        assert_eq!(uts_hostname(&pod("  subdomain: web\n"), &dns).unwrap(), "p");
        assert_eq!(
            uts_hostname(&pod("  setHostnameAsFQDN: true\n"), &dns).unwrap(),
            "p"
        );
        let long = format!("  hostname: {}\n{fqdn}", "h".repeat(40));
        let e = uts_hostname(&pod(&long), &dns).unwrap_err().to_string();
        assert!(
            e.contains("is too long (64 characters is the max, 67 characters requested)"),
            "{e}"
        );
    }

    #[test]
    fn resolv_conf_by_dns_policy() {
        let dns = ClusterDns {
            servers: vec!["10.96.0.10".parse().unwrap()],
            domain: "cluster.local".into(),
        };
        let host = "nameserver 192.168.1.1\nsearch lan\n";
        assert_eq!(
            resolv_conf_text(&pod(""), &dns, host),
            "nameserver 10.96.0.10\nsearch shop.svc.cluster.local svc.cluster.local cluster.local lan\noptions ndots:5\n"
        );
        // On the host network ClusterFirst means the host's; WithHostNet not.
        assert_eq!(
            resolv_conf_text(&pod("  hostNetwork: true\n"), &dns, host),
            host
        );
        let with_host_net = pod("  hostNetwork: true\n  dnsPolicy: ClusterFirstWithHostNet\n");
        assert!(
            resolv_conf_text(&with_host_net, &dns, host).starts_with("nameserver 10.96.0.10\n")
        );
        assert_eq!(
            resolv_conf_text(&pod("  dnsPolicy: Default\n"), &dns, host),
            host
        );
        // None: only the pod's dnsConfig; with other policies it is merged.
        let none = pod(
            "  dnsPolicy: None\n  dnsConfig:\n    nameservers: [1.1.1.1]\n    searches: [a.example]\n    options: [{name: ndots, value: '2'}, {name: edns0}]\n",
        );
        assert_eq!(
            resolv_conf_text(&none, &dns, host),
            "nameserver 1.1.1.1\nsearch a.example\noptions ndots:2 edns0\n"
        );
        let merged = pod(
            "  dnsConfig:\n    nameservers: [10.96.0.10, 1.1.1.1]\n    options: [{name: ndots, value: '1'}]\n",
        );
        assert_eq!(
            resolv_conf_text(&merged, &dns, host),
            "nameserver 10.96.0.10\nnameserver 1.1.1.1\nsearch shop.svc.cluster.local svc.cluster.local cluster.local lan\noptions ndots:1\n"
        );
        let default_merged = pod("  dnsPolicy: Default\n  dnsConfig:\n    searches: [x.example]\n");
        assert_eq!(
            resolv_conf_text(&default_merged, &dns, host),
            "nameserver 192.168.1.1\nsearch lan x.example\n"
        );
        // No cluster DNS configured: the host's, as upstream falls back.
        assert_eq!(
            resolv_conf_text(&pod(""), &ClusterDns::default(), host),
            host
        );
    }
}

#[cfg(test)]
mod host_path_tests {
    use super::*;
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    #[test]
    fn special_file_types_are_told_apart() {
        // Removed (with its socket and nodes) whatever the outcome.
        let scratch = crate::state::TestDir::new("hostpath");
        let dir = &scratch.0;
        let socket = dir.join("agent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        // Device nodes of the test's own (loop0's and null's numbers): only
        // their type matters, nothing opens them.
        let block = dir.join("block");
        let char = dir.join("char");
        let made_block = mknod(&block, SFlag::S_IFBLK, Mode::S_IRUSR, makedev(7, 0));
        let made_char = mknod(&char, SFlag::S_IFCHR, Mode::S_IRUSR, makedev(1, 3));
        let check = |path: &Path, kind| check_host_path("v", &path.to_string_lossy(), kind);
        let results = [
            check(&socket, HostPathKind::Socket).is_ok(),
            check(&block, HostPathKind::BlockDevice).is_ok(),
            check(&char, HostPathKind::CharDevice).is_ok(),
            check(&socket, HostPathKind::CharDevice).is_err(),
            check(&char, HostPathKind::BlockDevice).is_err(),
            check(&block, HostPathKind::Socket).is_err(),
            check(&dir.join("absent"), HostPathKind::Socket).is_err(),
        ];
        drop(listener);
        made_block.unwrap();
        made_char.unwrap();
        assert_eq!(results, [true; 7]);
        let err = check_host_path("v", "/", HostPathKind::Socket).unwrap_err();
        assert_eq!(err.to_string(), "volume v: hostPath /: is not a socket");
    }
}
