//! The resources this server serves, with what discovery says of them.

#[derive(Debug)]
pub struct Resource {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub short_names: &'static [&'static str],
    pub subresources: &'static [&'static str],
    /// Whether writes to the main resource leave `status` alone (it has a
    /// status subresource).
    pub has_status: bool,
}

const VERBS: [&str; 8] = [
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

pub const RESOURCES: &[Resource] = &[
    Resource {
        group: "apps",
        version: "v1",
        plural: "daemonsets",
        singular: "daemonset",
        kind: "DaemonSet",
        namespaced: true,
        short_names: &["ds"],
        subresources: &["status"],
        has_status: true,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "namespaces",
        singular: "namespace",
        kind: "Namespace",
        namespaced: false,
        short_names: &["ns"],
        subresources: &["status"],
        has_status: true,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "pods",
        singular: "pod",
        kind: "Pod",
        namespaced: true,
        short_names: &["po"],
        subresources: &["status", "log", "binding", "ephemeralcontainers", "resize"],
        has_status: true,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "nodes",
        singular: "node",
        kind: "Node",
        namespaced: false,
        short_names: &["no"],
        subresources: &["status", "proxy"],
        has_status: true,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "configmaps",
        singular: "configmap",
        kind: "ConfigMap",
        namespaced: true,
        short_names: &["cm"],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "secrets",
        singular: "secret",
        kind: "Secret",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "serviceaccounts",
        singular: "serviceaccount",
        kind: "ServiceAccount",
        namespaced: true,
        short_names: &["sa"],
        subresources: &["token"],
        has_status: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "services",
        singular: "service",
        kind: "Service",
        namespaced: true,
        short_names: &["svc"],
        subresources: &["status"],
        has_status: true,
    },
    Resource {
        group: "coordination.k8s.io",
        version: "v1",
        plural: "leases",
        singular: "lease",
        kind: "Lease",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "events.k8s.io",
        version: "v1",
        plural: "events",
        singular: "event",
        kind: "Event",
        namespaced: true,
        short_names: &["ev"],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "certificates.k8s.io",
        version: "v1",
        plural: "certificatesigningrequests",
        singular: "certificatesigningrequest",
        kind: "CertificateSigningRequest",
        namespaced: false,
        short_names: &["csr"],
        subresources: &["approval", "status"],
        has_status: true,
    },
    Resource {
        group: "node.k8s.io",
        version: "v1",
        plural: "runtimeclasses",
        singular: "runtimeclass",
        kind: "RuntimeClass",
        namespaced: false,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterroles",
        singular: "clusterrole",
        kind: "ClusterRole",
        namespaced: false,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "clusterrolebindings",
        singular: "clusterrolebinding",
        kind: "ClusterRoleBinding",
        namespaced: false,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "roles",
        singular: "role",
        kind: "Role",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
    Resource {
        group: "rbac.authorization.k8s.io",
        version: "v1",
        plural: "rolebindings",
        singular: "rolebinding",
        kind: "RoleBinding",
        namespaced: true,
        short_names: &[],
        subresources: &[],
        has_status: false,
    },
];

impl Resource {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// The store's name for this resource: `group/plural`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.group, self.plural)
    }

    pub fn find(group: &str, version: &str, plural: &str) -> Option<&'static Resource> {
        RESOURCES
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
    }

    /// The APIResource entries of a group version, as discovery lists them.
    pub fn discovery(group: &str, version: &str) -> Vec<serde_json::Value> {
        let mut out = Vec::new();
        for r in RESOURCES
            .iter()
            .filter(|r| r.group == group && r.version == version)
        {
            out.push(serde_json::json!({
                "name": r.plural,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": VERBS,
                "shortNames": r.short_names,
                "storageVersionHash": "",
            }));
            for sub in r.subresources {
                let (kind, verbs): (&str, &[&str]) = match *sub {
                    "status" => (r.kind, &["get", "patch", "update"]),
                    "log" => ("Pod", &["get"]),
                    "binding" => ("Binding", &["create"]),
                    "proxy" => (
                        "NodeProxyOptions",
                        &["create", "delete", "get", "patch", "update"],
                    ),
                    "token" => ("TokenRequest", &["create"]),
                    "approval" => (r.kind, &["get", "patch", "update"]),
                    _ => (r.kind, &["get"]),
                };
                let mut entry = serde_json::json!({
                    "name": format!("{}/{sub}", r.plural),
                    "singularName": "",
                    "namespaced": r.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                });
                if *sub == "token" {
                    entry["group"] = "authentication.k8s.io".into();
                    entry["version"] = "v1".into();
                }
                out.push(entry);
            }
        }
        out
    }

    /// Groups other than the core one, with their versions.
    pub fn groups() -> Vec<(&'static str, &'static str)> {
        let mut groups: Vec<(&str, &str)> = RESOURCES
            .iter()
            .filter(|r| !r.group.is_empty())
            .map(|r| (r.group, r.version))
            .collect();
        groups.dedup();
        groups
    }
}
