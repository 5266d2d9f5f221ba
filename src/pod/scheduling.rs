//! The scheduler's constraints a kubelet checks again when a pod reaches
//! it, with upstream's semantics (component-helpers' node affinity and
//! taint helpers): the node selector and the required node affinity, and
//! the taints a pod does not tolerate.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

/// The node as a pod's constraints see it.
pub struct NodeFields<'a> {
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
}

/// `spec.nodeSelector` and the required node affinity, both of which must
/// match. Preferred terms, pod (anti-)affinity and topology spread are the
/// scheduler's alone.
pub fn node_matches(spec: &core::PodSpec, node: &NodeFields) -> bool {
    let selector = spec
        .node_selector
        .iter()
        .flatten()
        .all(|(key, value)| node.labels.get(key) == Some(value));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    selector && required.is_none_or(|r| selector_matches(r, node))
}

/// Terms are ORed; a term without requirements matches nothing, as does a
/// selector without terms.
fn selector_matches(selector: &core::NodeSelector, node: &NodeFields) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if expressions.is_empty() && fields.is_empty() {
            return false;
        }
        expressions
            .iter()
            .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
            && fields.iter().all(|r| field_matches(r, node))
    })
}

/// A requirement on a label. One that is invalid (an unknown operator, `In`
/// without values, `Gt` without one integer) makes its term match nothing,
/// as upstream, where it fails to parse.
fn requirement_matches(requirement: &core::NodeSelectorRequirement, label: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let single_integer = || match values {
        [value] => value.parse::<i64>().ok(),
        _ => None,
    };
    let label_integer = || label.and_then(|l| l.parse::<i64>().ok());
    match requirement.operator.as_str() {
        "In" => !values.is_empty() && label.is_some_and(|l| values.iter().any(|v| v == l)),
        "NotIn" => !values.is_empty() && label.is_none_or(|l| values.iter().all(|v| v != l)),
        "Exists" => values.is_empty() && label.is_some(),
        "DoesNotExist" => values.is_empty() && label.is_none(),
        "Gt" => single_integer()
            .zip(label_integer())
            .is_some_and(|(v, l)| l > v),
        "Lt" => single_integer()
            .zip(label_integer())
            .is_some_and(|(v, l)| l < v),
        _ => false,
    }
}

/// Fields upstream lets a node selector name: `metadata.name`, with `In` or
/// `NotIn` and one value.
fn field_matches(requirement: &core::NodeSelectorRequirement, node: &NodeFields) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    if requirement.key != "metadata.name" || values.len() != 1 {
        return false;
    }
    match requirement.operator.as_str() {
        "In" => values[0] == node.name,
        "NotIn" => values[0] != node.name,
        _ => false,
    }
}

/// The first of the node's taints with one of `effects` that no toleration
/// of the pod tolerates. The kubelet checks only `NoExecute` (the others
/// keep pods from being scheduled, not from running); a scheduler also
/// `NoSchedule`.
pub fn untolerated<'a>(
    tolerations: &[core::Toleration],
    taints: &'a [core::Taint],
    effects: &[&str],
) -> Option<&'a core::Taint> {
    taints
        .iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|taint| !tolerations.iter().any(|t| tolerates(t, taint)))
}

/// Upstream's `ToleratesTaint`: an empty effect tolerates every effect, an
/// empty key with `Exists` every key.
fn tolerates(toleration: &core::Toleration, taint: &core::Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value = toleration.value.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => !key.is_empty() && value == taint.value.as_deref().unwrap_or_default(),
        "Exists" => value.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> core::PodSpec {
        let mut spec = json!({"containers": [{"name": "c", "image": "i"}]});
        for (k, v) in value.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(spec).unwrap()
    }

    fn labels() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "edge-1".to_owned()),
            ("kubernetes.io/arch".to_owned(), "arm64".to_owned()),
            ("cores".to_owned(), "4".to_owned()),
        ])
    }

    fn matches(spec_fields: serde_json::Value) -> bool {
        let labels = labels();
        let node = NodeFields {
            name: "edge-1",
            labels: &labels,
        };
        node_matches(&spec(spec_fields), &node)
    }

    fn required(terms: serde_json::Value) -> serde_json::Value {
        json!({"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }}})
    }

    /// What the DaemonSet controller writes into every pod it makes.
    #[test]
    fn a_daemonset_pods_affinity_matches_its_node_only() {
        let daemonset = |node: &str| {
            required(json!([{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}
            ]}]))
        };
        assert!(matches(daemonset("edge-1")));
        assert!(!matches(daemonset("edge-2")));
    }

    #[test]
    fn every_operator_as_upstream() {
        let expression = |key: &str, operator: &str, values: serde_json::Value| {
            let mut requirement = json!({"key": key, "operator": operator});
            if !values.is_null() {
                requirement["values"] = values;
            }
            matches(required(json!([{"matchExpressions": [requirement]}])))
        };
        assert!(expression(
            "kubernetes.io/arch",
            "In",
            json!(["amd64", "arm64"])
        ));
        assert!(!expression("kubernetes.io/arch", "In", json!(["amd64"])));
        assert!(!expression("missing", "In", json!(["x"])));
        assert!(!expression("kubernetes.io/arch", "In", json!([])));
        assert!(expression("kubernetes.io/arch", "NotIn", json!(["amd64"])));
        assert!(expression("missing", "NotIn", json!(["x"])));
        assert!(!expression("kubernetes.io/arch", "NotIn", json!(["arm64"])));
        assert!(expression("cores", "Exists", json!(null)));
        assert!(!expression("missing", "Exists", json!(null)));
        assert!(expression("missing", "DoesNotExist", json!(null)));
        assert!(!expression("cores", "DoesNotExist", json!(null)));
        assert!(expression("cores", "Gt", json!(["2"])));
        assert!(!expression("cores", "Gt", json!(["4"])));
        assert!(expression("cores", "Lt", json!(["8"])));
        assert!(!expression("cores", "Lt", json!(["x"])));
        assert!(!expression("cores", "Gt", json!(["1", "2"])));
        assert!(!expression("kubernetes.io/arch", "Gt", json!(["1"])));
        assert!(!expression("cores", "Matches", json!(["4"])));
    }

    #[test]
    fn terms_are_ored_their_requirements_anded_and_empty_terms_match_nothing() {
        let arm = json!({"key": "kubernetes.io/arch", "operator": "In", "values": ["arm64"]});
        let big = json!({"key": "cores", "operator": "Gt", "values": ["16"]});
        assert!(matches(required(
            json!([{"matchExpressions": [big]}, {"matchExpressions": [arm]}])
        )));
        assert!(!matches(required(
            json!([{"matchExpressions": [arm, big]}])
        )));
        assert!(!matches(required(json!([{}]))));
        assert!(!matches(required(json!([]))));
        let name_not = json!({"key": "metadata.name", "operator": "NotIn", "values": ["edge-1"]});
        assert!(!matches(required(
            json!([{"matchExpressions": [arm], "matchFields": [name_not]}])
        )));
        let other_field = json!({"key": "metadata.uid", "operator": "In", "values": ["edge-1"]});
        assert!(!matches(required(json!([{"matchFields": [other_field]}]))));
    }

    #[test]
    fn node_selector_and_affinity_must_both_match() {
        let arm =
            json!([{"matchExpressions": [{"key": "kubernetes.io/arch", "operator": "Exists"}]}]);
        let mut both = required(arm);
        both["nodeSelector"] = json!({"cores": "4"});
        assert!(matches(both.clone()));
        both["nodeSelector"] = json!({"cores": "8"});
        assert!(!matches(both));
        assert!(matches(json!({})));
        // Preferred terms and pod affinity are the scheduler's.
        assert!(matches(json!({"affinity": {
            "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1,
                "preference": {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}
        }})));
    }

    #[test]
    fn only_untolerated_no_execute_taints_count() {
        let taints: Vec<core::Taint> = serde_json::from_value(json!([
            {"key": "dedicated", "value": "edge", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"},
            {"key": "zone", "value": "a", "effect": "NoExecute"}
        ]))
        .unwrap();
        let left = |tolerations: serde_json::Value| {
            let tolerations: Vec<core::Toleration> = serde_json::from_value(tolerations).unwrap();
            untolerated(&tolerations, &taints, &["NoExecute"]).map(|t| t.key.clone())
        };
        assert_eq!(
            left(json!([])).as_deref(),
            Some("node.kubernetes.io/unreachable")
        );
        // As DaemonSet pods carry it.
        let unreachable = json!({"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"});
        assert_eq!(left(json!([unreachable])).as_deref(), Some("zone"));
        let zone = json!({"key": "zone", "operator": "Equal", "value": "a"});
        assert_eq!(left(json!([unreachable, zone])), None);
        let wrong_value = json!({"key": "zone", "value": "b"});
        assert_eq!(
            left(json!([unreachable, wrong_value])).as_deref(),
            Some("zone")
        );
        // Tolerates everything.
        assert_eq!(left(json!([{"operator": "Exists"}])), None);
        // An empty key needs Exists.
        assert!(left(json!([{"operator": "Equal"}])).is_some());
        let no_schedule_only = json!({"operator": "Exists", "effect": "NoSchedule"});
        assert!(left(json!([no_schedule_only])).is_some());
    }
}
