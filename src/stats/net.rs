//! Network counters from a `/proc/<pid>/net/dev`: the node's, or a pod's
//! through its first container's process, which is in the pod's network
//! namespace.

use std::path::Path;

use super::PodStats;

/// One interface's counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// The interfaces of a `net/dev` text, loopback left out as upstream.
pub fn interfaces(net_dev: &str) -> Vec<Interface> {
    net_dev
        .lines()
        .skip(2)
        .filter_map(|line| {
            let (name, counters) = line.split_once(':')?;
            let name = name.trim();
            let c: Vec<u64> = counters
                .split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect();
            (name != "lo" && c.len() >= 12).then(|| Interface {
                name: name.to_owned(),
                rx_bytes: c[0],
                rx_packets: c[1],
                rx_errors: c[2],
                rx_dropped: c[3],
                tx_bytes: c[8],
                tx_packets: c[9],
                tx_errors: c[10],
                tx_dropped: c[11],
            })
        })
        .collect()
}

/// The pod's interfaces, read in its network namespace; none when no
/// container's process is known. Blocking reads.
pub fn pod_interfaces(runtime_root: &Path, pod: &PodStats) -> Option<Vec<Interface>> {
    let pid = pod
        .containers
        .iter()
        .find_map(|c| init_pid(runtime_root, &c.id))?;
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/dev")).ok()?;
    Some(interfaces(&text))
}

/// The node's own interfaces.
pub fn node_interfaces() -> Option<Vec<Interface>> {
    Some(interfaces(&std::fs::read_to_string("/proc/net/dev").ok()?))
}

/// The first process of a container, from the runtime's state.
fn init_pid(runtime_root: &Path, id: &str) -> Option<u64> {
    let text = std::fs::read_to_string(runtime_root.join(id).join("state.json")).ok()?;
    serde_json::from_str::<serde_json::Value>(&text).ok()?["init_process_pid"].as_u64()
}

#[cfg(test)]
pub(crate) const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0\n  eth0:    5000      40    1    3    0     0          0         0     3000      30    2    4    0     0       0          0\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_net_dev() {
        assert_eq!(
            interfaces(NET_DEV),
            vec![Interface {
                name: "eth0".into(),
                rx_bytes: 5000,
                rx_packets: 40,
                rx_errors: 1,
                rx_dropped: 3,
                tx_bytes: 3000,
                tx_packets: 30,
                tx_errors: 2,
                tx_dropped: 4,
            }]
        );
    }
}
