//! Image references with Docker's normalisation: `busybox` is
//! `docker.io/library/busybox:latest`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct ReferenceError {
    pub reference: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// `docker.io`, `quay.io`, `127.0.0.1:5000`.
    pub registry: String,
    /// `library/busybox`.
    pub repository: String,
    pub tag: Option<String>,
    /// `sha256:<hex>`.
    pub digest: Option<String>,
}

pub const DOCKER_HUB: &str = "docker.io";

impl Reference {
    pub fn parse(text: &str) -> Result<Reference, ReferenceError> {
        let err = |reason| ReferenceError {
            reference: text.to_owned(),
            reason,
        };
        if text.is_empty() || text.len() > 4096 {
            return Err(err("empty or too long"));
        }
        let (rest, digest) = match text.split_once('@') {
            Some((rest, digest)) => {
                let hex = digest
                    .strip_prefix("sha256:")
                    .ok_or_else(|| err("only sha256 digests are supported"))?;
                if hex.len() != 64
                    || !hex
                        .bytes()
                        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
                {
                    return Err(err("malformed digest"));
                }
                (rest, Some(digest.to_owned()))
            }
            None => (text, None),
        };
        // A tag follows the last ':' after the last '/'; a ':' before that is
        // a registry port.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (
                &rest[..last_slash + i],
                Some(rest[last_slash + i + 1..].to_owned()),
            ),
            None => (rest, None),
        };
        if let Some(tag) = &tag {
            let valid = !tag.is_empty()
                && tag.len() <= 128
                && tag
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
                && !tag.starts_with(['.', '-']);
            if !valid {
                return Err(err("malformed tag"));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, remainder))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_owned(), remainder.to_owned())
            }
            _ => (DOCKER_HUB.to_owned(), name.to_owned()),
        };
        let repository = if registry == DOCKER_HUB && !repository.contains('/') {
            format!("library/{repository}")
        } else {
            repository
        };
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.starts_with(|ch: char| ch.is_ascii_alphanumeric())
                && c.ends_with(|ch: char| ch.is_ascii_alphanumeric())
        };
        if !repository.split('/').all(component_ok) {
            return Err(err("malformed repository name"));
        }
        if registry.is_empty() || registry.contains(['/', '@', ' ']) {
            return Err(err("malformed registry"));
        }
        let tag = match (&tag, &digest) {
            (None, None) => Some("latest".to_owned()),
            _ => tag,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What to ask the registry for: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn docker_normalisation() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("user/app"), "docker.io/user/app:latest");
        assert_eq!(norm("quay.io/a/b:v1"), "quay.io/a/b:v1");
        assert_eq!(norm("localhost/app"), "localhost/app:latest");
        assert_eq!(norm("127.0.0.1:5000/demo:1"), "127.0.0.1:5000/demo:1");
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("127.0.0.1:5000/demo@{d}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_reference(), d);
        assert_eq!(r.registry, "127.0.0.1:5000");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "Upper/case",
            "a:b:c",
            "x@sha256:abc",
            "x@md5:aa",
            "a/../b",
            "a:",
            "-a",
        ] {
            assert!(Reference::parse(bad).is_err(), "{bad}");
        }
    }
}
