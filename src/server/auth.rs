//! Who may use the kubelet API, as upstream's kubelet decides it: a client
//! certificate (the client CA verified it during the handshake), else a
//! bearer token the API server vouches for (TokenReview), else anonymous if
//! configured; then a SubjectAccessReview on `nodes/<node>` with the
//! subresource the path belongs to and the verb of the method, unless the
//! mode is AlwaysAllow. Reviews are cached as upstream caches them, so a
//! scraper every 15 s costs the uplink a request every few minutes.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use http::Method;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};

use crate::config::{ApiAuth, AuthorizationMode};
use crate::kube::Api;

/// Reviews kept at most; a flood of distinct tokens must not grow the
/// agent without bound.
const CACHE_LIMIT: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the client's certificate says, as its connection found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerCertificate {
    /// None sent, or no client CA to check one against.
    Absent,
    /// Signed by the client CA. Without a common name it names nobody,
    /// which is no error: the token or anonymous access still count.
    Verified(Option<UserInfo>),
    /// Not signed by the client CA (or expired, or not for clients).
    Untrusted,
}

impl UserInfo {
    /// The user of a verified client certificate; authenticated users are
    /// in `system:authenticated`, as upstream's authenticators add it.
    pub fn from_certificate(name: String, mut groups: Vec<String>) -> UserInfo {
        if !groups.iter().any(|g| g == AUTHENTICATED) {
            groups.push(AUTHENTICATED.to_owned());
        }
        UserInfo {
            name,
            uid: String::new(),
            groups,
            extra: BTreeMap::new(),
        }
    }

    fn anonymous() -> UserInfo {
        UserInfo {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

const AUTHENTICATED: &str = "system:authenticated";

/// Why a request is refused, with upstream's status and text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// 401.
    #[error("Unauthorized")]
    Unauthorized,
    /// 403.
    #[error("Forbidden (user={user}, verb={verb}, resource=nodes, subresource={subresource})")]
    Forbidden {
        user: String,
        verb: &'static str,
        subresource: &'static str,
    },
    /// 500: the API server could not be asked.
    #[error(
        "Authorization error (user={user}, verb={verb}, resource=nodes, subresource={subresource}): {message}"
    )]
    Failed {
        user: String,
        verb: &'static str,
        subresource: &'static str,
        message: String,
    },
}

/// What a request asks of the node, as upstream's kubelet names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

impl Attributes {
    pub fn of(method: &Method, path: &str) -> Attributes {
        let verb = match *method {
            Method::POST => "create",
            Method::GET => "get",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE => "delete",
            _ => "",
        };
        let under = |prefix: &str| {
            path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        };
        let subresource = if under("/stats") {
            "stats"
        } else if under("/metrics") {
            "metrics"
        } else if under("/logs") {
            "log"
        } else if under("/checkpoint") {
            "checkpoint"
        } else {
            "proxy"
        };
        Attributes { verb, subresource }
    }
}

type DecisionKey = (UserInfo, Attributes);
/// A token's SHA-256 (the token itself is not kept).
type TokenKey = [u8; 32];

pub struct Authority {
    settings: ApiAuth,
    api: Api,
    node: String,
    /// A token's user, if the API server accepted it, and when it said so.
    tokens: RefCell<HashMap<TokenKey, (Option<UserInfo>, Instant)>>,
    decisions: RefCell<HashMap<DecisionKey, (bool, Instant)>>,
}

impl Authority {
    pub fn new(settings: ApiAuth, api: Api, node: &str) -> Authority {
        Authority {
            settings,
            api,
            node: node.to_owned(),
            tokens: RefCell::default(),
            decisions: RefCell::default(),
        }
    }

    /// The request's user: its certificate's, else its bearer token's,
    /// else anonymous where allowed. A token that does not check out, or a
    /// certificate the client CA did not sign, is 401 even with anonymous
    /// allowed, as upstream (whose anonymous step fails on any error of
    /// the steps before).
    pub async fn authenticate(
        &self,
        certificate: &PeerCertificate,
        authorization: Option<&str>,
    ) -> Result<UserInfo, Refusal> {
        if let PeerCertificate::Verified(Some(user)) = certificate {
            return Ok(user.clone());
        }
        // Without the webhook a token means nothing, as upstream (whose
        // chain then has no token authenticator).
        let token = authorization
            .and_then(bearer_token)
            .filter(|_| self.settings.token_webhook);
        match token {
            Some(token) => self.review_token(token).await.ok_or(Refusal::Unauthorized),
            None if *certificate == PeerCertificate::Untrusted => Err(Refusal::Unauthorized),
            None if self.settings.anonymous => Ok(UserInfo::anonymous()),
            None => Err(Refusal::Unauthorized),
        }
    }

    async fn review_token(&self, token: &str) -> Option<UserInfo> {
        let key: TokenKey = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes()).into();
        if let Some((user, at)) = self.tokens.borrow().get(&key)
            && at.elapsed() < self.settings.token_cache_ttl
        {
            return user.clone();
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..Default::default()
        };
        let answer: TokenReview = match self
            .api
            .create("/apis/authentication.k8s.io/v1/tokenreviews", &review)
            .await
        {
            Ok(answer) => answer,
            // Not cached: the next request asks again.
            Err(e) => {
                log::warn!("kubelet API: TokenReview: {e}");
                return None;
            }
        };
        let status = answer.status.unwrap_or_default();
        let user = status
            .user
            .filter(|_| status.authenticated == Some(true))
            .and_then(|u| {
                let name = u.username.filter(|n| !n.is_empty())?;
                let mut user = UserInfo::from_certificate(name, u.groups.unwrap_or_default());
                user.uid = u.uid.unwrap_or_default();
                user.extra = u.extra.unwrap_or_default();
                Some(user)
            });
        remember(
            &self.tokens,
            key,
            (user.clone(), Instant::now()),
            |(_, at)| at.elapsed() < self.settings.token_cache_ttl,
        );
        user
    }

    /// Whether `user` may do `attributes` on this node.
    pub async fn authorize(&self, user: &UserInfo, attributes: Attributes) -> Result<(), Refusal> {
        if self.settings.mode == AuthorizationMode::AlwaysAllow {
            return Ok(());
        }
        let ttl = |allowed: bool| {
            if allowed {
                self.settings.allowed_cache_ttl
            } else {
                self.settings.denied_cache_ttl
            }
        };
        let key = (user.clone(), attributes);
        let cached = self
            .decisions
            .borrow()
            .get(&key)
            .filter(|(allowed, at)| at.elapsed() < ttl(*allowed))
            .map(|(allowed, _)| *allowed);
        let allowed = match cached {
            Some(allowed) => allowed,
            None => {
                let allowed = self.review_access(user, attributes).await?;
                remember(
                    &self.decisions,
                    key,
                    (allowed, Instant::now()),
                    |(allowed, at)| at.elapsed() < ttl(*allowed),
                );
                allowed
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(Refusal::Forbidden {
                user: user.name.clone(),
                verb: attributes.verb,
                subresource: attributes.subresource,
            })
        }
    }

    async fn review_access(
        &self,
        user: &UserInfo,
        attributes: Attributes,
    ) -> Result<bool, Refusal> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attributes.verb.to_owned()),
                    group: Some(String::new()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attributes.subresource.to_owned()),
                    name: Some(self.node.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer: SubjectAccessReview = self
            .api
            .create(
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                &review,
            )
            .await
            .map_err(|e| Refusal::Failed {
                user: user.name.clone(),
                verb: attributes.verb,
                subresource: attributes.subresource,
                message: e.to_string(),
            })?;
        Ok(answer.status.is_some_and(|s| s.allowed))
    }
}

/// `Bearer <token>`, the scheme in any case, as upstream reads it (its
/// second word; an empty one is no token).
fn bearer_token(header: &str) -> Option<&str> {
    let mut words = header.trim().splitn(3, ' ');
    let scheme = words.next()?;
    let token = words.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Caches `value`, first dropping what `fresh` says has expired, and
/// everything if the cache is still full.
fn remember<K: std::hash::Hash + Eq, V>(
    cache: &RefCell<HashMap<K, V>>,
    key: K,
    value: V,
    fresh: impl Fn(&V) -> bool,
) {
    let mut cache = cache.borrow_mut();
    if cache.len() >= CACHE_LIMIT {
        cache.retain(|_, v| fresh(v));
        if cache.len() >= CACHE_LIMIT {
            cache.clear();
        }
    }
    cache.insert(key, value);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_upstreams_subresources_and_methods_to_verbs() {
        let get = |path| Attributes::of(&Method::GET, path);
        assert_eq!(get("/stats/summary").subresource, "stats");
        assert_eq!(get("/stats").subresource, "stats");
        assert_eq!(get("/statsx").subresource, "proxy");
        assert_eq!(get("/metrics").subresource, "metrics");
        assert_eq!(get("/metrics/resource").subresource, "metrics");
        assert_eq!(get("/logs/syslog").subresource, "log");
        assert_eq!(get("/containerLogs/ns/p/c").subresource, "proxy");
        assert_eq!(get("/pods").subresource, "proxy");
        assert_eq!(get("/healthz").subresource, "proxy");
        assert_eq!(get("/pods").verb, "get");
        assert_eq!(Attributes::of(&Method::POST, "/exec/a/b/c").verb, "create");
        assert_eq!(Attributes::of(&Method::DELETE, "/x").verb, "delete");
        assert_eq!(Attributes::of(&Method::HEAD, "/x").verb, "");
    }

    #[test]
    fn bearer_tokens_as_upstream_reads_them() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer abc"), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer "), None);
        assert_eq!(bearer_token("Bearer a b"), Some("a"));
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn a_full_cache_drops_the_expired_then_everything() {
        let cache = RefCell::new(HashMap::new());
        for i in 0..CACHE_LIMIT {
            remember(&cache, i, i % 2 == 0, |fresh| *fresh);
        }
        assert_eq!(cache.borrow().len(), CACHE_LIMIT);
        remember(&cache, CACHE_LIMIT, true, |fresh| *fresh);
        assert_eq!(cache.borrow().len(), CACHE_LIMIT / 2 + 1);
        let full = RefCell::new(
            (0..CACHE_LIMIT)
                .map(|i| (i, true))
                .collect::<HashMap<_, _>>(),
        );
        remember(&full, CACHE_LIMIT, true, |fresh| *fresh);
        assert_eq!(full.borrow().len(), 1);
    }
}
