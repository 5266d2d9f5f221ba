//! The oom_score_adj of the agent, and the lowest it can give containers.

use std::fs;
use std::io;

/// Gives the agent (and, as they inherit it, its launcher and monitors)
/// `adj`, as upstream's kubelet gives itself its oomScoreAdj. Set with
/// CAP_SYS_RESOURCE, it is also the lowest score that what they start may
/// set without that capability: runc sets a container's from inside the
/// pod's user namespace, where it has none.
pub fn set_own(adj: i32) -> io::Result<()> {
    fs::write("/proc/self/oom_score_adj", adj.to_string())
}

/// The lowest score containers can be given, if there is one: without
/// CAP_SYS_RESOURCE (an agent in a container), none below the agent's own,
/// so theirs are raised to it, as containerd's `restrict_oom_score_adj`
/// does, rather than failing to start.
pub fn floor() -> Option<i32> {
    let sys_resource = crate::pod::CAPABILITIES
        .iter()
        .position(|c| *c == "SYS_RESOURCE")?;
    if super::own_capabilities("CapEff")? & (1 << sys_resource) != 0 {
        return None;
    }
    fs::read_to_string("/proc/self/oom_score_adj")
        .ok()?
        .trim()
        .parse()
        .ok()
}
