//! AppArmor profiles of containers, admitted as upstream's kubelet does: a
//! pod that asks for confinement (any profile but Unconfined) runs only
//! where the kernel has AppArmor enabled ("Cannot enforce AppArmor"). A
//! Localhost profile that is not loaded fails in the runtime when the
//! container is created, as upstream; RuntimeDefault (and no profile at
//! all) is nanolet's own profile, see `runtime::apparmor`. A container's profile is its own
//! `appArmorProfile`, else the deprecated per-container annotation, else
//! the pod's, in upstream's order.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as core;

use super::validate::invalid;
use super::{Pod, PodError};
use crate::runtime::apparmor::{HostAppArmor, RUNTIME_DEFAULT};

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

/// Whether the pod may run on `host`: confinement needs AppArmor, and
/// RuntimeDefault needs the default profile the agent loads (a privileged
/// container runs without it, as under containerd, so it needs nothing).
pub fn admit(pod: &Pod, host: HostAppArmor) -> Result<(), PodError> {
    for container in pod.every_container() {
        let profile = container.security.apparmor.as_ref();
        match (profile, host) {
            (None | Some(AppArmorProfile::Unconfined), _) => {}
            (Some(_), HostAppArmor::Disabled) => {
                return Err(PodError::AppArmor(
                    "AppArmor is not enabled on the host".into(),
                ));
            }
            (Some(AppArmorProfile::Localhost(_)), _) => {}
            (Some(AppArmorProfile::RuntimeDefault), _) if container.security.privileged => {}
            (Some(AppArmorProfile::RuntimeDefault), HostAppArmor::Enabled { runtime_default }) => {
                if !runtime_default {
                    return Err(PodError::AppArmor(format!(
                        "the runtime default profile {RUNTIME_DEFAULT} is not loaded (see the agent's log)"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// [`admit`] on this host, as the agent found it at start: it takes a
/// reboot to change, so admitting a pod again (each manifest scan does)
/// always gives the same answer.
pub fn admit_on_host(pod: &Pod) -> Result<(), PodError> {
    admit(pod, crate::runtime::apparmor::host())
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
        let off = HostAppArmor::Disabled;
        assert!(admit(&both, off).is_ok());
        assert!(admit(&pod(json!({}), json!({})), off).is_ok());
        let err = admit(&localhost, off).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Cannot enforce AppArmor: AppArmor is not enabled on the host"
        );
        let loaded = HostAppArmor::Enabled {
            runtime_default: true,
        };
        assert!(admit(&localhost, loaded).is_ok());

        // RuntimeDefault needs the agent's profile loaded, unless the
        // container is privileged and so runs without it.
        let default = pod(
            json!({}),
            json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
        );
        assert!(admit(&default, loaded).is_ok());
        let unloaded = HostAppArmor::Enabled {
            runtime_default: false,
        };
        let err = admit(&default, unloaded).unwrap_err();
        assert!(
            err.to_string().contains("nanolet-default is not loaded"),
            "{err}"
        );
        let privileged = pod(
            json!({"container.apparmor.security.beta.kubernetes.io/c": "runtime/default"}),
            json!({"privileged": true}),
        );
        assert!(admit(&privileged, unloaded).is_ok());
        assert!(admit(&privileged, off).is_err());
    }
}
