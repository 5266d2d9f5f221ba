//! The OCI / Docker image documents nanolet reads: manifests, indexes
//! (manifest lists) and image configs. Only the fields used are modelled;
//! unknown fields are ignored, as the specs require of readers.

use serde::{Deserialize, Serialize};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// What a manifest request accepts, in order of preference.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    #[serde(default)]
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

/// A manifest or an index: the registry's Content-Type and the document's
/// own `mediaType` tell them apart.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Document {
    #[serde(default)]
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: Option<String>,
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
}

impl Document {
    pub fn is_index(&self, content_type: &str) -> bool {
        let media = self.media_type.as_deref().unwrap_or(content_type);
        media == OCI_INDEX
            || media == DOCKER_LIST
            || (self.config.is_none() && !self.manifests.is_empty())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub architecture: String,
    #[serde(default)]
    pub os: String,
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootFs>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default)]
    pub cmd: Option<Vec<String>>,
    #[serde(default)]
    pub working_dir: Option<String>,
    #[serde(default)]
    pub stop_signal: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootFs {
    #[serde(rename = "type", default)]
    pub kind: String,
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

/// This machine's platform in OCI terms.
pub fn host_platform() -> Platform {
    let (architecture, variant) = match std::env::consts::ARCH {
        "x86_64" => ("amd64", None),
        "aarch64" => ("arm64", Some("v8")),
        "arm" => ("arm", Some("v7")),
        "x86" => ("386", None),
        "riscv64" => ("riscv64", None),
        "powerpc64" => ("ppc64le", None),
        "s390x" => ("s390x", None),
        other => (other, None),
    };
    Platform {
        architecture: architecture.into(),
        os: "linux".into(),
        variant: variant.map(Into::into),
    }
}

/// Picks the index entry for `want`. A missing variant in the index matches
/// (arm64 images rarely carry "v8"); for arm, v7 hardware also runs v6 and v5.
pub fn select_platform<'a>(manifests: &'a [Descriptor], want: &Platform) -> Option<&'a Descriptor> {
    let compatible_variants: Vec<Option<&str>> =
        match (want.architecture.as_str(), want.variant.as_deref()) {
            ("arm", Some("v8")) => vec![Some("v8"), Some("v7"), Some("v6"), Some("v5"), None],
            ("arm", Some("v7")) => vec![Some("v7"), Some("v6"), Some("v5"), None],
            ("arm", Some("v6")) => vec![Some("v6"), Some("v5"), None],
            ("arm64", _) => vec![Some("v8"), None],
            (_, v) => vec![v, None],
        };
    compatible_variants.into_iter().find_map(|variant| {
        manifests.iter().find(|m| {
            m.platform.as_ref().is_some_and(|p| {
                p.os == want.os
                    && p.architecture == want.architecture
                    && p.variant.as_deref() == variant
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(arch: &str, variant: Option<&str>) -> Descriptor {
        Descriptor {
            media_type: "application/vnd.oci.image.manifest.v1+json".into(),
            digest: format!("sha256:{arch}{}", variant.unwrap_or("")),
            size: 1,
            platform: Some(Platform {
                architecture: arch.into(),
                os: "linux".into(),
                variant: variant.map(Into::into),
            }),
            urls: vec![],
        }
    }

    #[test]
    fn platform_selection() {
        let index = vec![
            entry("amd64", None),
            entry("arm64", Some("v8")),
            entry("arm", Some("v6")),
            entry("arm", Some("v7")),
        ];
        let pick = |arch: &str, variant: Option<&str>| {
            select_platform(
                &index,
                &Platform {
                    architecture: arch.into(),
                    os: "linux".into(),
                    variant: variant.map(Into::into),
                },
            )
            .map(|d| d.digest.clone())
        };
        assert_eq!(pick("amd64", None).as_deref(), Some("sha256:amd64"));
        assert_eq!(pick("arm64", Some("v8")).as_deref(), Some("sha256:arm64v8"));
        assert_eq!(pick("arm", Some("v7")).as_deref(), Some("sha256:armv7"));
        let only_v6 = vec![entry("arm", Some("v6"))];
        let v7 = Platform {
            architecture: "arm".into(),
            os: "linux".into(),
            variant: Some("v7".into()),
        };
        assert!(select_platform(&only_v6, &v7).is_some());
        assert_eq!(pick("s390x", None), None);
        let arm64_plain = vec![entry("arm64", None)];
        let want = Platform {
            architecture: "arm64".into(),
            os: "linux".into(),
            variant: Some("v8".into()),
        };
        assert!(select_platform(&arm64_plain, &want).is_some());
    }

    #[test]
    fn tells_index_from_manifest() {
        let m: Document = serde_json::from_str(
            r#"{"schemaVersion":2,"config":{"digest":"sha256:a","size":1},"layers":[]}"#,
        )
        .unwrap();
        assert!(!m.is_index("application/vnd.oci.image.manifest.v1+json"));
        let i: Document = serde_json::from_str(
            r#"{"schemaVersion":2,"manifests":[{"digest":"sha256:a","size":1}]}"#,
        )
        .unwrap();
        assert!(i.is_index(""));
    }
}
