//! AppArmor profiles of containers, admitted as upstream's kubelet does: a
//! pod that asks for confinement (any profile but Unconfined) runs only
//! where the kernel has AppArmor enabled ("Cannot enforce AppArmor"). A
//! Localhost profile that is not loaded fails in the runtime when the
//! container is created, as upstream. A container's profile is its own
//! `appArmorProfile`, else the deprecated per-container annotation, else
//! the pod's, in upstream's order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use super::validate::invalid;
use super::{Pod, PodError};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppArmorProfile {
    Unconfined,
    /// The runtime's default profile.
    RuntimeDefault,
    /// A profile loaded on the host, by name.
    Localhost(String),
}

/// The annotation of upstream's beta API, still honoured (after the field).
const ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

pub fn from_field(
    field: &str,
    profile: Option<&core::AppArmorProfile>,
) -> Result<Option<AppArmorProfile>, PodError> {
    let Some(profile) = profile else {
        return Ok(None);
    };
    let localhost = profile
        .localhost_profile
        .as_deref()
        .map(str::trim)
        .filter(|l| !l.is_empty());
    let lfield = format!("{field}.appArmorProfile.localhostProfile");
    match (profile.type_.as_str(), localhost) {
        ("Localhost", Some(name)) => Ok(Some(AppArmorProfile::Localhost(name.to_owned()))),
        ("Localhost", None) => Err(invalid(
            lfield,
            "must be set when AppArmor type is Localhost",
        )),
        (_, Some(_)) => Err(invalid(
            lfield,
            "can only be set when AppArmor type is Localhost",
        )),
        ("RuntimeDefault", None) => Ok(Some(AppArmorProfile::RuntimeDefault)),
        ("Unconfined", None) => Ok(Some(AppArmorProfile::Unconfined)),
        (other, None) => Err(invalid(
            format!("{field}.appArmorProfile.type"),
            format!("unknown value {other:?}"),
        )),
    }
}

/// The profile the deprecated annotation gives `container`, if any.
pub fn from_annotation(
    annotations: Option<&BTreeMap<String, String>>,
    container: &str,
) -> Result<Option<AppArmorProfile>, PodError> {
    let key = format!("{ANNOTATION_PREFIX}{container}");
    let Some(value) = annotations.and_then(|a| a.get(&key)) else {
        return Ok(None);
    };
    match value.as_str() {
        "runtime/default" => Ok(Some(AppArmorProfile::RuntimeDefault)),
        "unconfined" => Ok(Some(AppArmorProfile::Unconfined)),
        other => match other.strip_prefix("localhost/").filter(|n| !n.is_empty()) {
            Some(name) => Ok(Some(AppArmorProfile::Localhost(name.to_owned()))),
            None => Err(invalid(
                format!("metadata.annotations[{key}]"),
                format!("invalid AppArmor profile {other:?}"),
            )),
        },
    }
}

/// Whether the pod may run on a host whose AppArmor is `enabled`.
pub fn admit(pod: &Pod, enabled: bool) -> Result<(), PodError> {
    for container in pod.all_containers() {
        let profile = container.security.apparmor.as_ref();
        match profile {
            None | Some(AppArmorProfile::Unconfined) => {}
            Some(_) if !enabled => {
                return Err(PodError::AppArmor(
                    "AppArmor is not enabled on the host".into(),
                ));
            }
            Some(AppArmorProfile::Localhost(_)) => {}
            // nanolet ships no profile of its own yet (containerd loads
            // one it generates).
            Some(AppArmorProfile::RuntimeDefault) => {
                return Err(PodError::Unsupported {
                    field: format!(
                        "container {:?}: appArmorProfile type RuntimeDefault",
                        container.name
                    ),
                });
            }
        }
    }
    Ok(())
}

/// [`admit`] on this host, whose AppArmor is read once: it takes a reboot
/// to change, so admitting a pod again (each manifest scan does) always
/// gives the same answer.
pub fn admit_on_host(pod: &Pod) -> Result<(), PodError> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled = *ENABLED.get_or_init(|| {
        std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
            .is_ok_and(|v| v.trim_start().starts_with('Y'))
    });
    admit(pod, enabled)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Validated only: admission is what these tests call themselves.
    fn pod(annotations: serde_json::Value, security: serde_json::Value) -> Pod {
        let document = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "i:1", "securityContext": security}]}});
        crate::pod::validate(&document, "test.yaml", "u").unwrap()
    }

    #[test]
    fn profiles_from_fields_annotations_and_the_pod() {
        use serde_json::json;
        let localhost = pod(
            json!({}),
            json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "edge-web"}}),
        );
        let profile = AppArmorProfile::Localhost("edge-web".into());
        assert_eq!(localhost.containers[0].security.apparmor, Some(profile));
        let old = json!({"container.apparmor.security.beta.kubernetes.io/c": "localhost/old"});
        let annotated = pod(old.clone(), json!({}));
        assert_eq!(
            annotated.containers[0].security.apparmor,
            Some(AppArmorProfile::Localhost("old".into()))
        );
        // The container's field wins over the annotation.
        let both = pod(old, json!({"appArmorProfile": {"type": "Unconfined"}}));
        assert_eq!(
            both.containers[0].security.apparmor,
            Some(AppArmorProfile::Unconfined)
        );

        // Without AppArmor on the host only Unconfined (or nothing) runs.
        assert!(admit(&both, false).is_ok());
        assert!(admit(&pod(json!({}), json!({})), false).is_ok());
        let err = admit(&localhost, false).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        assert!(admit(&localhost, true).is_ok());
    }
}
