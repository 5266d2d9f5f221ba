//! Bootstrap tokens, as the real server's bootstrap token authenticator
//! reads them: a bearer token `<id>.<secret>` names the Secret
//! `bootstrap-token-<id>` in kube-system, of type
//! `bootstrap.kubernetes.io/token`, whose `token-id` and `token-secret`
//! must match, whose `usage-bootstrap-authentication` is `true` and whose
//! `expiration`, if any, is still ahead. Its user is `system:bootstrap:<id>`
//! in `system:bootstrappers` and the Secret's `auth-extra-groups`.
//!
//! What such a user may do is RBAC's to say (`system:node-bootstrapper`,
//! bound as kubeadm binds it): see `server.rs`.

use base64::Engine;
use serde_json::Value;

use crate::server::User;
use crate::store::Store;

pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
pub const GROUP: &str = "system:bootstrappers";

/// The user of `token`, if it is a valid bootstrap token.
pub fn user(store: &Store, token: &str) -> Option<User> {
    let (id, secret) = token.split_once('.')?;
    let token_chars = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !token_chars(id, 6) || !token_chars(secret, 16) {
        return None;
    }
    let object = store.get(&crate::store::key(
        "/secrets",
        "kube-system",
        &format!("bootstrap-token-{id}"),
    ))?;
    if object.get("type").and_then(Value::as_str) != Some(SECRET_TYPE)
        || object.pointer("/metadata/deletionTimestamp").is_some()
    {
        return None;
    }
    let data = |field: &str| -> Option<String> {
        let encoded = object.pointer(&format!("/data/{field}"))?.as_str()?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok()?;
        String::from_utf8(bytes).ok()
    };
    if data("token-id").as_deref() != Some(id)
        || !constant_time_eq(
            data("token-secret").unwrap_or_default().as_bytes(),
            secret.as_bytes(),
        )
        || data("usage-bootstrap-authentication").as_deref() != Some("true")
    {
        return None;
    }
    if let Some(expiration) = data("expiration") {
        // An expiration that does not parse is an invalid token, as upstream.
        let at: jiff::Timestamp = expiration.parse().ok()?;
        if at <= jiff::Timestamp::now() {
            return None;
        }
    }
    let mut groups = vec![GROUP.to_owned()];
    if let Some(extra) = data("auth-extra-groups") {
        for group in extra.split(',').map(str::trim).filter(|g| !g.is_empty()) {
            // Upstream refuses a token whose extra groups are outside
            // system:bootstrappers:*.
            let valid = group
                .strip_prefix("system:bootstrappers:")
                .is_some_and(|rest| {
                    !rest.is_empty()
                        && !rest.ends_with([':', '-'])
                        && rest.bytes().all(|b| {
                            b.is_ascii_lowercase() || b.is_ascii_digit() || b == b':' || b == b'-'
                        })
                });
            if !valid {
                return None;
            }
            groups.push(group.to_owned());
        }
    }
    Some(User {
        name: format!("system:bootstrap:{id}"),
        groups,
    })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store_with(data: Value, extra: Value) -> Store {
        use base64::Engine;
        let engine = base64::engine::general_purpose::STANDARD;
        let encoded: serde_json::Map<String, Value> = data
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), json!(engine.encode(v.as_str().unwrap()))))
            .collect();
        let mut secret = json!({"type": SECRET_TYPE, "data": encoded,
            "metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system"}});
        if let (Some(secret), Some(extra)) = (secret.as_object_mut(), extra.as_object()) {
            secret.extend(extra.clone());
        }
        let mut store = Store::new(10);
        store.put(
            crate::store::key("/secrets", "kube-system", "bootstrap-token-abcdef"),
            secret,
            crate::store::EventType::Added,
        );
        store
    }

    fn valid() -> Value {
        json!({"token-id": "abcdef", "token-secret": "0123456789abcdef",
               "usage-bootstrap-authentication": "true"})
    }

    #[test]
    fn a_token_is_its_secret_while_it_may_authenticate() {
        let store = store_with(valid(), json!({}));
        let found = user(&store, "abcdef.0123456789abcdef").unwrap();
        assert_eq!(found.name, "system:bootstrap:abcdef");
        assert_eq!(found.groups, [GROUP]);
        for token in [
            "abcdef.0123456789abcdeX",
            "abcdef.0123456789abcde",
            "ABCDEF.0123456789abcdef",
            "abcdef0123456789abcdef",
            "",
        ] {
            assert!(user(&store, token).is_none(), "{token}");
        }
        let mut data = valid();
        data["usage-bootstrap-authentication"] = "false".into();
        assert!(user(&store_with(data, json!({})), "abcdef.0123456789abcdef").is_none());
        let mut data = valid();
        data["expiration"] = "2000-01-01T00:00:00Z".into();
        assert!(user(&store_with(data, json!({})), "abcdef.0123456789abcdef").is_none());
        let mut data = valid();
        data["expiration"] = "next week".into();
        assert!(user(&store_with(data, json!({})), "abcdef.0123456789abcdef").is_none());
        let opaque = store_with(valid(), json!({"type": "Opaque"}));
        assert!(user(&opaque, "abcdef.0123456789abcdef").is_none());
        let deleting = store_with(
            valid(),
            json!({"metadata": {"name": "bootstrap-token-abcdef", "namespace": "kube-system",
                                "deletionTimestamp": "2026-01-01T00:00:00Z"}}),
        );
        assert!(user(&deleting, "abcdef.0123456789abcdef").is_none());
    }

    #[test]
    fn extra_groups_must_be_bootstrappers() {
        let with = |groups: &str| {
            let mut data = valid();
            data["auth-extra-groups"] = groups.into();
            user(&store_with(data, json!({})), "abcdef.0123456789abcdef")
        };
        let found = with("system:bootstrappers:kubeadm:default-node-token").unwrap();
        assert_eq!(
            found.groups,
            [GROUP, "system:bootstrappers:kubeadm:default-node-token"]
        );
        for bad in [
            "system:masters",
            "system:bootstrappers:",
            "system:bootstrappers:x-",
        ] {
            assert!(with(bad).is_none(), "{bad}");
        }
    }
}
