//! Admission of API pods, as upstream's kubelet runs the scheduler's
//! predicates again: the pod's OS, its node name, the node selector and
//! required node affinity, the node's `NoExecute` taints; then, against the
//! pods admitted before it (in creation order), its requests within what
//! they leave of the node's allocatable CPU, memory and extended resources,
//! its host ports free, and the pod count within maxPods. A refused pod
//! gets phase Failed with upstream's reason (`NodeAffinity`, `OutOfcpu`,
//! `OutOfexample.com/dongle`, `NodePorts`...).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use crate::pod::Pod;
use crate::pod::scheduling::{self, NodeFields};

/// A refusal: upstream's reason and message.
pub type Refusal = (String, String);

/// The node as admission sees it: the API's Node once the agent has it
/// (with the labels and taints an administrator set), before that what the
/// agent registers it with.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<core::Taint>,
    /// Extended resources in the node's allocatable, which an
    /// administrator advertises by patching the node's status.
    pub extended: BTreeMap<String, u64>,
}

impl NodeView {
    pub fn from_node(node: &core::Node) -> NodeView {
        let extended = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .into_iter()
            .flatten()
            .filter(|(name, _)| crate::pod::is_extended_resource(name))
            .filter_map(|(name, q)| {
                let milli = crate::quantity::parse_milli(&q.0).ok()?;
                Some((name.clone(), u64::try_from(milli / 1000).ok()?))
            })
            .collect();
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
            extended,
        }
    }
}

fn predicate(name: &str, description: &str) -> Refusal {
    (
        name.to_owned(),
        format!("Predicate {name} failed: {description}"),
    )
}

/// The checks that do not depend on other pods, in upstream's order.
/// Taints are not checked for static pods, as upstream.
pub fn fits_node(pod: &core::Pod, node: &NodeView, check_taints: bool) -> Result<(), Refusal> {
    let os_label = pod
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubernetes.io/os"));
    if os_label.is_some_and(|os| os != "linux") {
        return Err((
            "PodOSSelectorNodeLabelDoesNotMatch".into(),
            "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label".into(),
        ));
    }
    let spec = pod.spec.clone().unwrap_or_default();
    if spec.os.as_ref().is_some_and(|os| os.name != "linux") {
        return Err((
            "PodOSNotSupported".into(),
            "Failed to admit pod as the OS field doesn't match node OS".into(),
        ));
    }
    let fields = NodeFields {
        name: &node.name,
        labels: &node.labels,
    };
    if !scheduling::node_matches(&spec, &fields) {
        return Err(predicate(
            "NodeAffinity",
            "node(s) didn't match Pod's node affinity/selector",
        ));
    }
    if spec
        .node_name
        .as_deref()
        .is_some_and(|n| !n.is_empty() && n != node.name)
    {
        return Err(predicate(
            "NodeName",
            "node(s) didn't match the requested node name",
        ));
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    if check_taints && scheduling::untolerated(tolerations, &node.taints, &["NoExecute"]).is_some()
    {
        return Err(predicate(
            "TaintToleration",
            "node(s) had untolerated taint",
        ));
    }
    hugepages_fit(&spec)
}

/// The node sets up no huge pages for pods and reports 0 of each size, so
/// a pod that asks for some is refused as upstream's resource fit refuses
/// it (static pods too: upstream admits them by resources as well).
fn hugepages_fit(spec: &core::PodSpec) -> Result<(), Refusal> {
    let containers = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers);
    for c in containers {
        let lists = c
            .resources
            .iter()
            .flat_map(|r| r.limits.iter().chain(&r.requests));
        for (name, amount) in lists.flatten() {
            if !name.starts_with("hugepages-") {
                continue;
            }
            let requested = crate::quantity::parse_bytes(&amount.0).unwrap_or(u64::MAX);
            if requested > 0 {
                return Err((
                    format!("OutOf{name}"),
                    format!(
                        "Node didn't have enough resource: {name}, requested: {requested}, used: 0, capacity: 0"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A pod's CPU (millicores) and memory requests, init containers counted
/// as upstream does, with its runtime class's overhead.
pub fn requests(pod: &Pod) -> (u64, u64) {
    let (overhead_cpu, overhead_memory) = pod.overhead;
    let pod_level = pod.pod_resources.as_ref();
    let cpu = pod_level
        .and_then(|r| r.cpu_request_milli)
        .unwrap_or_else(|| pod.pod_total(|c| c.resources.cpu_request_milli.unwrap_or(0)));
    let memory = pod_level
        .and_then(|r| r.memory_request)
        .unwrap_or_else(|| pod.pod_total(|c| c.resources.memory_request.unwrap_or(0)));
    (
        cpu.saturating_add(overhead_cpu),
        memory.saturating_add(overhead_memory),
    )
}

#[derive(Debug, Clone, Default)]
pub struct Capacity {
    pub cpu_milli: u64,
    pub memory: u64,
    pub pods: u64,
    pub extended: BTreeMap<String, u64>,
    /// Allocatable ephemeral storage, bytes.
    pub ephemeral_storage: u64,
    /// Healthy devices of the resources device plugins manage, which
    /// upstream's device manager admits (before the predicates, with its
    /// own reason) rather than the extended resources' count.
    pub devices: BTreeMap<String, u64>,
}

/// A host port a pod takes: protocol, host IP (`0.0.0.0` for all), port.
type HostPort = (String, String, i32);

/// What admitted pods use.
#[derive(Debug, Clone, Default)]
pub struct Used {
    pub cpu_milli: u64,
    pub memory: u64,
    pub ephemeral_storage: u64,
    pub pods: u64,
    pub extended: BTreeMap<String, u64>,
    pub host_ports: Vec<HostPort>,
}

impl Used {
    pub fn add(&mut self, pod: &Pod) {
        let (cpu, memory) = requests(pod);
        // Saturating: the amounts come from pods' specs.
        self.pods += 1;
        self.cpu_milli = self.cpu_milli.saturating_add(cpu);
        self.memory = self.memory.saturating_add(memory);
        self.ephemeral_storage = self
            .ephemeral_storage
            .saturating_add(ephemeral_request(pod));
        for (name, amount) in extended_requests(pod) {
            let total = self.extended.entry(name).or_default();
            *total = total.saturating_add(amount);
        }
        self.host_ports.extend(host_ports(&pod.manifest));
    }
}

/// A pod's ephemeral storage request, init containers counted as for CPU.
fn ephemeral_request(pod: &Pod) -> u64 {
    pod.pod_total(|c| c.resources.ephemeral_request.unwrap_or(0))
}

/// A pod's extended resources, init containers counted as for CPU.
fn extended_requests(pod: &Pod) -> BTreeMap<String, u64> {
    let names: std::collections::BTreeSet<&String> = pod
        .all_containers()
        .flat_map(|c| c.resources.extended.keys())
        .collect();
    names
        .into_iter()
        .map(|name| {
            let amount = pod.pod_total(|c| c.resources.extended.get(name).copied().unwrap_or(0));
            (name.clone(), amount)
        })
        .collect()
}

/// Every container's host ports, init containers' too, as upstream.
fn host_ports(pod: &core::Pod) -> Vec<HostPort> {
    let spec = pod.spec.as_ref();
    spec.into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|&port| port > 0)?;
            let protocol = p.protocol.clone().unwrap_or_else(|| "TCP".into());
            let ip = p
                .host_ip
                .clone()
                .filter(|ip| !ip.is_empty())
                .unwrap_or_else(|| "0.0.0.0".into());
            Some((protocol, ip, port))
        })
        .collect()
}

/// Two host ports clash on the same protocol and port when either takes
/// every address.
fn clash(a: &HostPort, b: &HostPort) -> bool {
    a.0 == b.0 && a.2 == b.2 && (a.1 == b.1 || a.1 == "0.0.0.0" || b.1 == "0.0.0.0")
}

/// Why an in-place resize of `pod` (its new CPU and memory requests)
/// cannot be actuated now, as upstream's allocation manager says it:
/// `Infeasible` when the node could never hold it, `Deferred` when the
/// other pods (`others`) leave too little.
pub fn resize_verdict(pod: &Pod, capacity: &Capacity, others: &Used) -> Option<Refusal> {
    let (cpu, memory) = requests(pod);
    let wanted = [
        ("cpu", cpu, others.cpu_milli, capacity.cpu_milli),
        ("memory", memory, others.memory, capacity.memory),
    ];
    if let Some((resource, requested, _, capacity)) = wanted
        .iter()
        .find(|(_, requested, _, capacity)| requested > capacity)
    {
        return Some((
            "Infeasible".into(),
            format!(
                "Node didn't have enough capacity: {resource}, requested: {requested}, capacity: {capacity}"
            ),
        ));
    }
    wanted
        .iter()
        .find(|(_, requested, used, capacity)| used + requested > *capacity)
        .map(|(resource, requested, used, capacity)| {
            (
                "Deferred".into(),
                format!(
                    "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
                ),
            )
        })
}

/// `Err((reason, message))` when `pod` does not fit; otherwise it is added
/// to `used`. Extended resources the node does not advertise are left out,
/// as upstream (they may be cluster-level resources).
pub fn admit(pod: &Pod, capacity: &Capacity, used: &mut Used) -> Result<(), Refusal> {
    let (cpu, memory) = requests(pod);
    let refuse = |resource: &str, requested: u64, used: u64, capacity: u64| {
        let reason = format!("OutOf{resource}");
        let message = format!(
            "Node didn't have enough resource: {resource}, requested: {requested}, used: {used}, capacity: {capacity}"
        );
        Err((reason, message))
    };
    if used.pods + 1 > capacity.pods {
        return refuse("pods", 1, used.pods, capacity.pods);
    }
    if cpu > 0 && used.cpu_milli.saturating_add(cpu) > capacity.cpu_milli {
        return refuse("cpu", cpu, used.cpu_milli, capacity.cpu_milli);
    }
    if memory > 0 && used.memory.saturating_add(memory) > capacity.memory {
        return refuse("memory", memory, used.memory, capacity.memory);
    }
    let storage = ephemeral_request(pod);
    if storage > 0 && used.ephemeral_storage.saturating_add(storage) > capacity.ephemeral_storage {
        return refuse(
            "ephemeral-storage",
            storage,
            used.ephemeral_storage,
            capacity.ephemeral_storage,
        );
    }
    for (name, amount) in extended_requests(pod) {
        if amount == 0 {
            continue;
        }
        let taken = used.extended.get(&name).copied().unwrap_or(0);
        if let Some(&healthy) = capacity.devices.get(&name) {
            let why = if healthy == 0 {
                format!("no healthy devices present; cannot allocate unhealthy devices {name}")
            } else if taken.saturating_add(amount) > healthy {
                format!(
                    "requested number of devices unavailable for {name}. Requested: {amount}, Available: {}",
                    healthy.saturating_sub(taken)
                )
            } else {
                continue;
            };
            return Err((
                "UnexpectedAdmissionError".into(),
                format!("Allocate failed due to {why}, which is unexpected"),
            ));
        }
        let Some(&available) = capacity.extended.get(&name) else {
            continue;
        };
        if taken.saturating_add(amount) > available {
            return refuse(&name, amount, taken, available);
        }
    }
    let ports = host_ports(&pod.manifest);
    let taken = |p: &HostPort| used.host_ports.iter().any(|u| clash(u, p));
    // Also two containers of the one pod.
    let own = ports
        .iter()
        .enumerate()
        .any(|(i, p)| ports[..i].iter().any(|q| clash(p, q)));
    if own || ports.iter().any(taken) {
        return Err(predicate(
            "NodePorts",
            "node(s) didn't have free ports for the requested pod ports",
        ));
    }
    used.add(pod);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, memory: &str) -> Pod {
        crate::pod::manifest::parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n  - name: c\n    image: i:1\n    resources: {{requests: {{cpu: {cpu}, memory: {memory}}}}}\n"
        ))
    }

    #[test]
    fn fits_or_names_the_resource() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 2,
            extended: BTreeMap::new(),
            devices: BTreeMap::new(),
            ephemeral_storage: 0,
        };
        let mut used = Used::default();
        assert!(admit(&pod("600m", "100Mi"), &capacity, &mut used).is_ok());
        let (reason, message) = admit(&pod("500m", "100Mi"), &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "OutOfcpu");
        assert_eq!(
            message,
            "Node didn't have enough resource: cpu, requested: 500, used: 600, capacity: 1000"
        );
        assert_eq!(
            admit(&pod("100m", "2Gi"), &capacity, &mut used)
                .unwrap_err()
                .0,
            "OutOfmemory"
        );
        assert!(admit(&pod("100m", "1Mi"), &capacity, &mut used).is_ok());
        assert_eq!(
            admit(&pod("1m", "1Mi"), &capacity, &mut used)
                .unwrap_err()
                .0,
            "OutOfpods"
        );
    }

    fn manifest(text: &str) -> Pod {
        crate::pod::manifest::parse_one(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, labels: {{app: x}}}}\n{text}"
        ))
    }

    fn node() -> NodeView {
        NodeView {
            name: "edge-1".into(),
            labels: [("kubernetes.io/arch".to_owned(), "arm64".to_owned())].into(),
            taints: serde_json::from_value(serde_json::json!([
                {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
                {"key": "dedicated", "value": "edge", "effect": "NoSchedule"}
            ]))
            .unwrap(),
            extended: BTreeMap::new(),
        }
    }

    fn refusal(text: &str, check_taints: bool) -> Option<String> {
        fits_node(&manifest(text).manifest, &node(), check_taints)
            .err()
            .map(|(reason, message)| format!("{reason}: {message}"))
    }

    const TOLERATES: &str = "  tolerations: [{key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute}]\n";

    #[test]
    fn the_node_checks_with_upstreams_reasons() {
        let container = "  containers: [{name: c, image: i}]\n";
        assert_eq!(
            refusal(&format!("spec:\n{container}{TOLERATES}"), true),
            None
        );
        assert_eq!(
            refusal(&format!("spec:\n{container}"), true).as_deref(),
            Some(
                "TaintToleration: Predicate TaintToleration failed: node(s) had untolerated taint"
            )
        );
        // Static pods: taints are not the kubelet's to check.
        assert_eq!(refusal(&format!("spec:\n{container}"), false), None);
        let affinity = "  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchFields: [{key: metadata.name, operator: In, values: [edge-2]}]}]}}}\n";
        assert_eq!(
            refusal(&format!("spec:\n{container}{TOLERATES}{affinity}"), true).as_deref(),
            Some(
                "NodeAffinity: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"
            )
        );
        let elsewhere = "  nodeName: edge-2\n";
        assert!(
            refusal(&format!("spec:\n{container}{TOLERATES}{elsewhere}"), true)
                .is_some_and(|r| r.starts_with("NodeName: "))
        );
        let windows = "  os: {name: windows}\n";
        assert!(
            refusal(&format!("spec:\n{container}{TOLERATES}{windows}"), true)
                .is_some_and(|r| r.starts_with("PodOSNotSupported: "))
        );
    }

    #[test]
    fn extended_resources_the_node_advertises_are_counted() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 10,
            extended: [("example.com/dongle".to_owned(), 3)].into(),
            devices: BTreeMap::new(),
            ephemeral_storage: 0,
        };
        let dongles = |n: u32| {
            manifest(&format!(
                "spec:\n  containers: [{{name: c, image: i, resources: {{limits: {{example.com/dongle: {n}, other.org/thing: 5}}}}}}]\n"
            ))
        };
        let mut used = Used::default();
        assert!(admit(&dongles(2), &capacity, &mut used).is_ok());
        let (reason, message) = admit(&dongles(2), &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "OutOfexample.com/dongle");
        assert_eq!(
            message,
            "Node didn't have enough resource: example.com/dongle, requested: 2, used: 2, capacity: 3"
        );
        // The one left fits; what the node does not advertise is not counted.
        assert!(admit(&dongles(1), &capacity, &mut used).is_ok());
        assert_eq!(used.extended["other.org/thing"], 10);
    }

    #[test]
    fn device_plugins_resources_are_refused_as_upstreams_device_manager_does() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 10,
            // The API's Node says 5 (what the agent last posted, or an
            // administrator's patch): the plugin's healthy count rules.
            extended: [("example.com/serial".to_owned(), 5)].into(),
            devices: [
                ("example.com/serial".to_owned(), 2),
                ("example.com/gone".to_owned(), 0),
            ]
            .into(),
            ephemeral_storage: 0,
        };
        let asking = |resource: &str, n: u32| {
            manifest(&format!(
                "spec:\n  containers: [{{name: c, image: i, resources: {{limits: {{{resource}: {n}}}}}}}]\n"
            ))
        };
        let mut used = Used::default();
        assert!(admit(&asking("example.com/serial", 1), &capacity, &mut used).is_ok());
        let (reason, message) =
            admit(&asking("example.com/serial", 2), &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "UnexpectedAdmissionError");
        assert_eq!(
            message,
            "Allocate failed due to requested number of devices unavailable for example.com/serial. Requested: 2, Available: 1, which is unexpected"
        );
        assert!(admit(&asking("example.com/serial", 1), &capacity, &mut used).is_ok());
        let (_, message) = admit(&asking("example.com/gone", 1), &capacity, &mut used).unwrap_err();
        assert_eq!(
            message,
            "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices example.com/gone, which is unexpected"
        );
        // Asking for none of a resource with none healthy is no request.
        assert!(admit(&asking("example.com/gone", 0), &capacity, &mut used).is_ok());
        // Two containers' 2^63 each: a sum wrapping to 0 must not pass.
        let huge = manifest(
            "spec:\n  containers:\n  - {name: a, image: i, resources: {limits: {example.com/serial: 8Ei}}}\n  - {name: b, image: i, resources: {limits: {example.com/serial: 8Ei}}}\n",
        );
        assert_eq!(
            huge.pod_total(|c| c.resources.extended["example.com/serial"]),
            u64::MAX
        );
        let (reason, _) = admit(&huge, &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "UnexpectedAdmissionError");
    }

    #[test]
    fn ephemeral_storage_requests_are_counted_limits_standing_for_them() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 10,
            extended: BTreeMap::new(),
            devices: BTreeMap::new(),
            ephemeral_storage: 10 << 20,
        };
        let storage = |kind: &str, amount: &str| {
            manifest(&format!(
                "spec:\n  containers: [{{name: c, image: i, resources: {{{kind}: {{ephemeral-storage: {amount}}}}}}}]\n"
            ))
        };
        let mut used = Used::default();
        assert!(admit(&storage("requests", "6Mi"), &capacity, &mut used).is_ok());
        let (reason, message) = admit(&storage("limits", "5Mi"), &capacity, &mut used).unwrap_err();
        assert_eq!(reason, "OutOfephemeral-storage");
        assert_eq!(
            message,
            "Node didn't have enough resource: ephemeral-storage, requested: 5242880, used: 6291456, capacity: 10485760"
        );
        assert!(admit(&storage("limits", "4Mi"), &capacity, &mut used).is_ok());
        assert_eq!(used.ephemeral_storage, 10 << 20);
    }

    #[test]
    fn huge_pages_are_refused_as_the_node_has_none() {
        let node = NodeView {
            name: "n".into(),
            ..Default::default()
        };
        let pod = manifest(
            "spec:\n  containers: [{name: c, image: i, resources: {limits: {hugepages-2Mi: 4Mi, memory: 8Mi}, requests: {hugepages-2Mi: 4Mi, memory: 8Mi}}}]\n",
        );
        assert_eq!(
            fits_node(&pod.manifest, &node, false),
            Err((
                "OutOfhugepages-2Mi".into(),
                "Node didn't have enough resource: hugepages-2Mi, requested: 4194304, used: 0, capacity: 0".into()
            ))
        );
        let none = manifest(
            "spec:\n  containers: [{name: c, image: i, resources: {limits: {hugepages-1Gi: 0}}}]\n",
        );
        assert_eq!(fits_node(&none.manifest, &node, false), Ok(()));
    }

    #[test]
    fn host_ports_are_one_pods_at_a_time() {
        let capacity = Capacity {
            cpu_milli: 1000,
            memory: 1 << 30,
            pods: 10,
            extended: BTreeMap::new(),
            devices: BTreeMap::new(),
            ephemeral_storage: 0,
        };
        let ports = |ports: &str| {
            manifest(&format!(
                "spec:\n  containers: [{{name: c, image: i, ports: [{ports}]}}]\n"
            ))
        };
        let mut used = Used::default();
        assert!(
            admit(
                &ports("{containerPort: 80, hostPort: 8080}"),
                &capacity,
                &mut used
            )
            .is_ok()
        );
        let (reason, _) = admit(
            &ports("{containerPort: 81, hostPort: 8080}"),
            &capacity,
            &mut used,
        )
        .unwrap_err();
        assert_eq!(reason, "NodePorts");
        // Another protocol, or another address where neither takes all.
        assert!(
            admit(
                &ports("{containerPort: 80, hostPort: 8080, protocol: UDP}"),
                &capacity,
                &mut used
            )
            .is_ok()
        );
        assert!(
            admit(
                &ports("{containerPort: 80, hostPort: 9090, hostIP: 127.0.0.1}"),
                &capacity,
                &mut used
            )
            .is_ok()
        );
        assert!(
            admit(
                &ports("{containerPort: 80, hostPort: 9090, hostIP: 127.0.0.2}"),
                &capacity,
                &mut used
            )
            .is_ok()
        );
        assert!(
            admit(
                &ports("{containerPort: 80, hostPort: 9090}"),
                &capacity,
                &mut used
            )
            .is_err()
        );
        // Two containers of one pod.
        let twice = manifest(
            "spec:\n  containers: [{name: a, image: i, ports: [{containerPort: 1, hostPort: 7000}]}, {name: b, image: i, ports: [{containerPort: 2, hostPort: 7000}]}]\n",
        );
        assert!(admit(&twice, &capacity, &mut used).is_err());
    }
}
