//! Service account tokens (the TokenRequest API): JWTs with audience,
//! expiry and the pod they are bound to, signed ES256 with a key the server
//! keeps in its directory. The server accepts them as bearer tokens until
//! they expire.

use std::path::Path;

use base64::Engine;
use jiff::Timestamp;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
use serde_json::{Value, json};

pub struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    key_id: String,
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data)
}

impl Signer {
    /// Loads `dir/sa.key` (PKCS#8), creating it the first time.
    pub fn load_or_create(dir: &Path) -> anyhow::Result<Signer> {
        let path = dir.join("sa.key");
        let rng = SystemRandom::new();
        let pkcs8 = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(_) => {
                let doc = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
                    .map_err(|_| anyhow::anyhow!("generating the service account key"))?;
                std::fs::write(&path, doc.as_ref())?;
                doc.as_ref().to_vec()
            }
        };
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let key_id = b64(&ring::digest::digest(&ring::digest::SHA256, &pkcs8).as_ref()[..16]);
        Ok(Signer { key, rng, key_id })
    }

    /// A token for `system:serviceaccount:<ns>:<name>`; returns it and its
    /// expiry.
    pub fn issue(
        &self,
        namespace: &str,
        account: &Value,
        request: &Value,
    ) -> Result<(String, Timestamp), String> {
        let name = account
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        let uid = account
            .pointer("/metadata/uid")
            .and_then(Value::as_str)
            .unwrap_or("");
        let audiences = request
            .pointer("/spec/audiences")
            .and_then(Value::as_array)
            .filter(|a| !a.is_empty())
            .cloned()
            .unwrap_or_else(|| vec![json!("https://kubernetes.default.svc.cluster.local")]);
        // As the real server: at least 10 minutes, default one hour.
        let seconds = request
            .pointer("/spec/expirationSeconds")
            .and_then(Value::as_i64)
            .unwrap_or(3600);
        if seconds < 600 {
            return Err("spec.expirationSeconds: Invalid value: may not specify a duration less than 10 minutes".into());
        }
        let now = Timestamp::now();
        let expires = now + jiff::SignedDuration::from_secs(seconds);
        let mut info = json!({
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": uid},
        });
        if let Some(bound) = request
            .pointer("/spec/boundObjectRef")
            .filter(|b| !b.is_null())
        {
            let kind = bound["kind"].as_str().unwrap_or("").to_lowercase();
            info[kind] = json!({"name": bound["name"], "uid": bound["uid"]});
        }
        let claims = json!({
            "aud": audiences,
            "exp": expires.as_second(),
            "iat": now.as_second(),
            "nbf": now.as_second(),
            "iss": "https://kubernetes.default.svc.cluster.local",
            "jti": crate::api::new_uid(),
            "kubernetes.io": info,
            "sub": format!("system:serviceaccount:{namespace}:{name}"),
        });
        let header = json!({"alg": "ES256", "kid": self.key_id});
        let signing_input = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims.to_string().as_bytes())
        );
        let signature = self
            .key
            .sign(&self.rng, signing_input.as_bytes())
            .map_err(|_| "signing failed".to_owned())?;
        Ok((
            format!("{signing_input}.{}", b64(signature.as_ref())),
            expires,
        ))
    }
}
