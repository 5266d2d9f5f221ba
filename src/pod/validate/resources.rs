//! Requests and limits: of containers, of the pod, extended resources,
//! resize policies, and the QoS class they make.

use super::*;

pub(super) fn resource(
    list: Option<
        &std::collections::BTreeMap<
            String,
            k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        >,
    >,
    field: &str,
    name: &str,
) -> Result<Option<u128>, PodError> {
    let Some(list) = list else { return Ok(None) };
    for key in list.keys() {
        // Huge pages: admission refuses them (the node has none).
        if !matches!(key.as_str(), "cpu" | "memory" | "ephemeral-storage")
            && !is_extended_resource(key)
            && !key.starts_with("hugepages-")
        {
            return Err(unsupported(format!("{field}.{key}")));
        }
    }
    list.get(name)
        .map(|q| {
            quantity::parse_milli(&q.0)
                .map_err(|e| invalid(format!("{field}.{name}"), e.to_string()))
        })
        .transpose()
}

/// Upstream's extended resources: a domain-qualified name outside
/// `kubernetes.io/` (a device plugin's `example.com/dongle`).
pub fn is_extended_resource(name: &str) -> bool {
    name.contains('/') && !name.contains("kubernetes.io/") && !name.starts_with("requests.")
}

/// A container's extended resources: whole numbers, never overcommitted
/// (a request equals the limit; a limit alone is also the request, as the
/// API server defaults it).
pub(super) fn extended_resources(
    requests: Option<&BTreeMap<String, Quantity>>,
    limits: Option<&BTreeMap<String, Quantity>>,
    field: &str,
) -> Result<BTreeMap<String, u64>, PodError> {
    let whole = |list: &str, name: &str, q: &Quantity| -> Result<u64, PodError> {
        let field = format!("{field}.{list}.{name}");
        let milli = quantity::parse_milli(&q.0).map_err(|e| invalid(&field, e.to_string()))?;
        if milli % 1000 != 0 {
            return Err(invalid(field, "must be an integer"));
        }
        u64::try_from(milli / 1000).map_err(|_| invalid(field, "too large"))
    };
    let mut extended = BTreeMap::new();
    for (name, limit) in limits.into_iter().flatten() {
        if is_extended_resource(name) {
            extended.insert(name.clone(), whole("limits", name, limit)?);
        }
    }
    for (name, request) in requests.into_iter().flatten() {
        if !is_extended_resource(name) {
            continue;
        }
        let request = whole("requests", name, request)?;
        if extended.get(name) != Some(&request) {
            return Err(invalid(
                format!("{field}.requests.{name}"),
                "must be equal to the limit: extended resources cannot be overcommitted",
            ));
        }
    }
    Ok(extended)
}

/// The resources whose in-place resize restarts the container
/// (`resizePolicy` RestartContainer); NotRequired is the default.
pub(super) fn restart_on_resize(c: &core::Container, field: &str) -> Result<Vec<String>, PodError> {
    let mut restart = Vec::new();
    for (i, policy) in c.resize_policy.iter().flatten().enumerate() {
        let at = format!("{field}.resizePolicy[{i}]");
        if !matches!(policy.resource_name.as_str(), "cpu" | "memory") {
            return Err(invalid(
                format!("{at}.resourceName"),
                "supported values: \"cpu\", \"memory\"",
            ));
        }
        match policy.restart_policy.as_str() {
            "NotRequired" => {}
            "RestartContainer" => restart.push(policy.resource_name.clone()),
            _ => {
                return Err(invalid(
                    format!("{at}.restartPolicy"),
                    "supported values: \"NotRequired\", \"RestartContainer\"",
                ));
            }
        }
    }
    Ok(restart)
}

/// `spec.resources`: CPU and memory for the pod as a whole. Requests
/// default to limits, as the API server defaults them; only CPU and
/// memory are supported there, as upstream.
pub(super) fn pod_level_resources(
    r: Option<&core::ResourceRequirements>,
) -> Result<Option<Resources>, PodError> {
    let Some(r) = r else { return Ok(None) };
    let field = "spec.resources";
    for (kind, list) in [("requests", &r.requests), ("limits", &r.limits)] {
        if let Some(key) = list
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .find(|k| !matches!(k.as_str(), "cpu" | "memory"))
        {
            return Err(unsupported(format!("{field}.{kind}.{key}")));
        }
    }
    let amount = |list: &Option<BTreeMap<String, Quantity>>, kind: &str, name: &str, div: u128| {
        resource(list.as_ref(), &format!("{field}.{kind}"), name)
            .map(|v| v.map(|v| u64::try_from(v.div_ceil(div)).unwrap_or(u64::MAX)))
    };
    let cpu_limit = amount(&r.limits, "limits", "cpu", 1)?;
    let memory_limit = amount(&r.limits, "limits", "memory", 1000)?;
    let resources = Resources {
        cpu_request_milli: amount(&r.requests, "requests", "cpu", 1)?.or(cpu_limit),
        cpu_limit_milli: cpu_limit,
        memory_request: amount(&r.requests, "requests", "memory", 1000)?.or(memory_limit),
        memory_limit,
        ..Default::default()
    };
    let over =
        |request: Option<u64>, limit: Option<u64>| request.zip(limit).is_some_and(|(r, l)| r > l);
    if over(resources.cpu_request_milli, cpu_limit) || over(resources.memory_request, memory_limit)
    {
        return Err(invalid(
            format!("{field}.requests"),
            "must be less than or equal to the limit",
        ));
    }
    let empty = resources == Resources::default();
    Ok((!empty).then_some(resources))
}

/// Upstream's QoS class when the pod sets pod-level resources: from them
/// alone.
pub(super) fn qos_of_pod_level(r: &Resources) -> QosClass {
    let set = |v: Option<u64>| v.filter(|v| *v > 0);
    let (requests, limits) = (
        [set(r.cpu_request_milli), set(r.memory_request)],
        [set(r.cpu_limit_milli), set(r.memory_limit)],
    );
    if requests.iter().chain(&limits).all(Option::is_none) {
        QosClass::BestEffort
    } else if limits.iter().all(Option::is_some) && requests == limits {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}

/// The pod's QoS class by the upstream rules.
pub(super) fn qos_class(containers: &[Container]) -> QosClass {
    let r = |c: &Container| c.resources.clone();
    let any_set = containers.iter().any(|c| {
        let r = r(c);
        r.cpu_request_milli.is_some()
            || r.memory_request.is_some()
            || r.cpu_limit_milli.is_some()
            || r.memory_limit.is_some()
    });
    if !any_set {
        return QosClass::BestEffort;
    }
    let guaranteed = containers.iter().all(|c| {
        let r = r(c);
        r.cpu_limit_milli.is_some()
            && r.memory_limit.is_some()
            && r.cpu_request_milli == r.cpu_limit_milli
            && r.memory_request == r.memory_limit
    });
    if guaranteed {
        QosClass::Guaranteed
    } else {
        QosClass::Burstable
    }
}
