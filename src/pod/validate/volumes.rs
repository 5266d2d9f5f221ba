//! A pod's volumes: the types nanolet mounts and their items' paths and
//! modes.

use super::*;

pub(super) fn convert_volumes(volumes: &[core::Volume]) -> Result<Vec<Volume>, PodError> {
    let mut out: Vec<Volume> = Vec::new();
    for (i, v) in volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        dns_label(&format!("{field}.name"), &v.name, 63)?;
        if out.iter().any(|o| o.name == v.name) {
            return Err(invalid(
                format!("{field}.name"),
                format!("duplicate name {:?}", v.name),
            ));
        }
        let kinds: Vec<String> = match serde_json::to_value(v) {
            Ok(Value::Object(map)) => map
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| k != "name")
                .collect(),
            _ => Vec::new(),
        };
        let [kind] = kinds.as_slice() else {
            return Err(invalid(&field, "exactly one volume type is required"));
        };
        let source = if !MOUNTED_VOLUMES.contains(&kind.as_str()) {
            VolumeSource::Unsupported { kind: kind.clone() }
        } else if let Some(empty) = &v.empty_dir {
            let memory = match empty.medium.as_deref() {
                None | Some("") => false,
                Some("Memory") => true,
                Some(other) => {
                    return Err(unsupported(format!("{field}.emptyDir.medium={other}")));
                }
            };
            let size_limit = empty
                .size_limit
                .as_ref()
                .map(|q| {
                    crate::quantity::parse_bytes(&q.0)
                        .map_err(|e| invalid(format!("{field}.emptyDir.sizeLimit"), e.to_string()))
                })
                .transpose()?;
            VolumeSource::EmptyDir { memory, size_limit }
        } else if let Some(host) = &v.host_path {
            if !host.path.starts_with('/') {
                return Err(invalid(
                    format!("{field}.hostPath.path"),
                    "must be absolute",
                ));
            }
            let kind = match host.type_.as_deref() {
                None | Some("") => HostPathKind::Unchecked,
                Some("Directory") => HostPathKind::Directory,
                Some("DirectoryOrCreate") => HostPathKind::DirectoryOrCreate,
                Some("File") => HostPathKind::File,
                Some("FileOrCreate") => HostPathKind::FileOrCreate,
                Some("Socket") => HostPathKind::Socket,
                Some("CharDevice") => HostPathKind::CharDevice,
                Some("BlockDevice") => HostPathKind::BlockDevice,
                Some(other) => {
                    return Err(unsupported(format!("{field}.hostPath.type={other}")));
                }
            };
            VolumeSource::HostPath {
                path: host.path.clone(),
                kind,
            }
        } else {
            VolumeSource::Projected(projection(v, &field)?)
        };
        out.push(Volume {
            name: v.name.clone(),
            source,
        });
    }
    Ok(out)
}

/// File modes are 0–0777, as the API server validates them.
pub(super) fn mode(field: &str, mode: Option<i32>) -> Result<Option<u32>, PodError> {
    match mode {
        None => Ok(None),
        Some(m) if (0..=0o777).contains(&m) => Ok(Some(m as u32)),
        Some(_) => Err(invalid(field, "must be between 0 and 0777")),
    }
}

/// A relative path inside a volume: no `..` element, not absolute.
pub(super) fn item_path(field: &str, path: &str) -> Result<String, PodError> {
    if path.is_empty() || path.starts_with('/') || path.split('/').any(|p| p == "..") {
        return Err(invalid(field, "must be a relative path without '..'"));
    }
    if path.starts_with("..") {
        return Err(invalid(field, "must not start with '..'"));
    }
    Ok(path.to_owned())
}

pub(super) fn key_to_paths(
    field: &str,
    items: Option<&Vec<core::KeyToPath>>,
) -> Result<Vec<KeyToPath>, PodError> {
    items
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, item)| {
            Ok(KeyToPath {
                key: item.key.clone(),
                path: item_path(&format!("{field}.items[{i}].path"), &item.path)?,
                mode: mode(&format!("{field}.items[{i}].mode"), item.mode)?,
            })
        })
        .collect()
}

pub(super) fn resource_ref(
    field: &str,
    r: &core::ResourceFieldSelector,
) -> Result<ResourceRef, PodError> {
    match r.resource.as_str() {
        "limits.cpu" | "requests.cpu" | "limits.memory" | "requests.memory" => {}
        other => return Err(unsupported(format!("{field}.resource={other}"))),
    }
    let divisor = r.divisor.as_ref().map_or("1".to_owned(), |d| d.0.clone());
    if quantity::parse_milli(&divisor).map_or(true, |d| d == 0) {
        return Err(invalid(
            format!("{field}.divisor"),
            format!("{divisor:?} is not a valid divisor"),
        ));
    }
    Ok(ResourceRef {
        container: r.container_name.clone().filter(|c| !c.is_empty()),
        resource: r.resource.clone(),
        divisor,
    })
}

pub(super) fn downward_items(
    field: &str,
    items: Option<&Vec<core::DownwardAPIVolumeFile>>,
) -> Result<Vec<DownwardFile>, PodError> {
    let mut out = Vec::new();
    for (i, item) in items.into_iter().flatten().enumerate() {
        let ifield = format!("{field}.items[{i}]");
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(f), None) => {
                let path = f.field_path.as_str();
                let allowed = matches!(
                    path,
                    "metadata.name"
                        | "metadata.namespace"
                        | "metadata.uid"
                        | "metadata.labels"
                        | "metadata.annotations"
                ) || path.starts_with("metadata.labels['")
                    || path.starts_with("metadata.annotations['");
                if !allowed {
                    return Err(unsupported(format!("{ifield}.fieldRef.fieldPath={path}")));
                }
                DownwardValue::Field(path.to_owned())
            }
            (None, Some(r)) => {
                if r.container_name.as_deref().is_none_or(str::is_empty) {
                    return Err(invalid(
                        format!("{ifield}.resourceFieldRef.containerName"),
                        "required",
                    ));
                }
                DownwardValue::Resource(resource_ref(&format!("{ifield}.resourceFieldRef"), r)?)
            }
            _ => {
                return Err(invalid(
                    &ifield,
                    "exactly one of fieldRef or resourceFieldRef is required",
                ));
            }
        };
        out.push(DownwardFile {
            path: item_path(&format!("{ifield}.path"), &item.path)?,
            value,
            mode: mode(&format!("{ifield}.mode"), item.mode)?,
        });
    }
    Ok(out)
}

/// configMap, secret, downwardAPI and projected volumes, as one shape.
pub(super) fn projection(v: &core::Volume, field: &str) -> Result<Projection, PodError> {
    let mut sources = Vec::new();
    let default_mode;
    if let Some(cm) = &v.config_map {
        default_mode = mode(&format!("{field}.configMap.defaultMode"), cm.default_mode)?;
        sources.push(ProjectionSource::ConfigMap {
            name: cm.name.clone(),
            items: key_to_paths(&format!("{field}.configMap"), cm.items.as_ref())?,
            optional: cm.optional.unwrap_or(false),
        });
    } else if let Some(secret) = &v.secret {
        default_mode = mode(&format!("{field}.secret.defaultMode"), secret.default_mode)?;
        let name = secret.secret_name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(invalid(format!("{field}.secret.secretName"), "required"));
        }
        sources.push(ProjectionSource::Secret {
            name,
            items: key_to_paths(&format!("{field}.secret"), secret.items.as_ref())?,
            optional: secret.optional.unwrap_or(false),
        });
    } else if let Some(downward) = &v.downward_api {
        default_mode = mode(
            &format!("{field}.downwardAPI.defaultMode"),
            downward.default_mode,
        )?;
        sources.push(ProjectionSource::DownwardApi {
            items: downward_items(&format!("{field}.downwardAPI"), downward.items.as_ref())?,
        });
    } else if let Some(projected) = &v.projected {
        default_mode = mode(
            &format!("{field}.projected.defaultMode"),
            projected.default_mode,
        )?;
        for (i, s) in projected.sources.iter().flatten().enumerate() {
            let sfield = format!("{field}.projected.sources[{i}]");
            if let Some(cm) = &s.config_map {
                sources.push(ProjectionSource::ConfigMap {
                    name: cm.name.clone(),
                    items: key_to_paths(&format!("{sfield}.configMap"), cm.items.as_ref())?,
                    optional: cm.optional.unwrap_or(false),
                });
            } else if let Some(secret) = &s.secret {
                sources.push(ProjectionSource::Secret {
                    name: secret.name.clone(),
                    items: key_to_paths(&format!("{sfield}.secret"), secret.items.as_ref())?,
                    optional: secret.optional.unwrap_or(false),
                });
            } else if let Some(downward) = &s.downward_api {
                sources.push(ProjectionSource::DownwardApi {
                    items: downward_items(
                        &format!("{sfield}.downwardAPI"),
                        downward.items.as_ref(),
                    )?,
                });
            } else if let Some(token) = &s.service_account_token {
                let expiration_seconds = token.expiration_seconds.unwrap_or(3600);
                // The API server's own bounds.
                if !(600..=1 << 32).contains(&expiration_seconds) {
                    return Err(invalid(
                        format!("{sfield}.serviceAccountToken.expirationSeconds"),
                        "must be at least 600 (10 minutes)",
                    ));
                }
                sources.push(ProjectionSource::ServiceAccountToken {
                    audience: token.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds,
                    path: item_path(&format!("{sfield}.serviceAccountToken.path"), &token.path)?,
                });
            } else {
                return Err(invalid(&sfield, "no source"));
            }
        }
    } else {
        return Err(invalid(field, "no volume source"));
    }
    Ok(Projection {
        sources,
        default_mode: default_mode.unwrap_or(0o644),
    })
}
