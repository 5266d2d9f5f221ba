//! Distribution API v2 client: manifests and blobs, anonymous access with the
//! Bearer-token challenge flow, mirrors tried before the registry itself.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use http::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, RANGE, WWW_AUTHENTICATE};
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use hyper::body::Incoming;

use super::auth::Credentials;
use super::reference::{DOCKER_HUB, Reference};
use crate::http::{Client, HttpError, read_body};

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Http(#[from] HttpError),
    #[error("{url}: {status}{detail}")]
    Status {
        url: String,
        status: StatusCode,
        detail: String,
    },
    #[error("{url}: authentication required ({challenge}); no credentials configured")]
    Unauthorized { url: String, challenge: String },
    #[error("{url}: token response: {message}")]
    Token { url: String, message: String },
}

/// The headers asking for a blob from byte `offset` on.
fn range_from(offset: u64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if offset > 0
        && let Ok(range) = HeaderValue::from_str(&format!("bytes={offset}-"))
    {
        headers.insert(RANGE, range);
    }
    headers
}

/// (final URL, body, whether the body starts at `offset`): a server that
/// ignores the Range sends the whole blob.
fn opened_at(url: Uri, response: hyper::Response<Incoming>, offset: u64) -> (Uri, Incoming, bool) {
    let resumed = offset > 0 && response.status() == StatusCode::PARTIAL_CONTENT;
    (url, response.into_body(), resumed || offset == 0)
}

impl RegistryError {
    /// Whether trying again shortly may succeed: the connection failed, or
    /// the registry said it is overloaded or broken for now.
    pub fn is_transient(&self) -> bool {
        match self {
            RegistryError::Http(e) => e.is_transient(),
            RegistryError::Status { status, .. } => {
                status.is_server_error() || *status == StatusCode::TOO_MANY_REQUESTS
            }
            RegistryError::Unauthorized { .. } | RegistryError::Token { .. } => false,
        }
    }
}

const MAX_MANIFEST: usize = 4 << 20;
const MAX_TOKEN: usize = 1 << 20;

/// A token's host, repository and credentials.
type TokenKey = (String, String, [u8; 32]);

/// What tells credentials apart in the token cache: a digest of the
/// username and password (anonymous is its own key), so that the cache
/// keeps no password in the clear.
fn credentials_key(creds: Option<&Credentials>) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    if let Some(c) = creds {
        hash.update(c.username.len().to_le_bytes());
        hash.update(&c.username);
        hash.update(&c.password);
    }
    hash.finalize().into()
}

pub struct Registry {
    http: Client,
    mirrors: BTreeMap<String, Vec<String>>,
    /// Bearer tokens by (host, repository, credentials), reused until the
    /// registry says 401. The credentials are keyed whole (as a digest): a
    /// pod presenting someone's username with a wrong password must not
    /// get their token.
    tokens: RefCell<HashMap<TokenKey, String>>,
}

impl Registry {
    pub fn new(http: Client, mirrors: BTreeMap<String, Vec<String>>) -> Self {
        Registry {
            http,
            mirrors,
            tokens: RefCell::new(HashMap::new()),
        }
    }

    /// The hosts to try for `reference`'s registry: its mirrors, then itself.
    fn hosts(&self, reference: &Reference) -> Vec<String> {
        let own = if reference.registry == DOCKER_HUB {
            "registry-1.docker.io".to_owned()
        } else {
            reference.registry.clone()
        };
        let mut hosts = self
            .mirrors
            .get(&reference.registry)
            .cloned()
            .unwrap_or_default();
        hosts.push(own);
        hosts
    }

    fn url(&self, host: &str, path: &str) -> Result<Uri, RegistryError> {
        let scheme = if self.http.allows_plain_http(host) {
            "http"
        } else {
            "https"
        };
        let url = format!("{scheme}://{host}{path}");
        url.parse()
            .map_err(|_| HttpError::InvalidUrl { url }.into())
    }

    /// Fetches a manifest or index: (body, content type).
    pub async fn manifest(
        &self,
        reference: &Reference,
        creds: Option<&Credentials>,
    ) -> Result<(Vec<u8>, String), RegistryError> {
        let path = format!(
            "/v2/{}/manifests/{}",
            reference.repository,
            reference.manifest_reference()
        );
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static(super::manifest::ACCEPT));
        let (url, response) = self.get(reference, &path, &headers, creds).await?;
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_owned();
        let body = read_body(&url, response.into_body(), MAX_MANIFEST).await?;
        Ok((body, content_type))
    }

    /// Opens a blob for streaming from byte `offset` on: (final URL, body,
    /// whether the body starts at `offset`). A registry (or the storage it
    /// redirects to) that ignores the Range sends the whole blob.
    pub async fn blob(
        &self,
        reference: &Reference,
        digest: &str,
        creds: Option<&Credentials>,
        offset: u64,
    ) -> Result<(Uri, Incoming, bool), RegistryError> {
        let path = format!("/v2/{}/blobs/{digest}", reference.repository);
        let (url, response) = self
            .get(reference, &path, &range_from(offset), creds)
            .await?;
        Ok(opened_at(url, response, offset))
    }

    /// Opens a blob from one of its descriptor's `urls` (foreign and
    /// non-distributable layers), as [`Registry::blob`] does, but never
    /// with the registry's credentials: the URL may be anyone's.
    pub async fn blob_at(
        &self,
        url: &str,
        offset: u64,
    ) -> Result<(Uri, Incoming, bool), RegistryError> {
        let invalid = || HttpError::InvalidUrl {
            url: url.to_owned(),
        };
        let uri: Uri = url.parse().map_err(|_| invalid())?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(invalid().into());
        }
        let (final_url, response) = self
            .http
            .get(Method::GET, &uri, &range_from(offset), false)
            .await?;
        let status = response.status();
        if !status.is_success() {
            return Err(RegistryError::Status {
                url: final_url.to_string(),
                status,
                detail: String::new(),
            });
        }
        Ok(opened_at(final_url, response, offset))
    }

    /// GET `path` from the first host that answers 2xx; the last error
    /// otherwise. A mirror's failure is logged, not fatal.
    async fn get(
        &self,
        reference: &Reference,
        path: &str,
        extra: &HeaderMap,
        creds: Option<&Credentials>,
    ) -> Result<(Uri, hyper::Response<Incoming>), RegistryError> {
        let hosts = self.hosts(reference);
        let mut last_err = None;
        for (i, host) in hosts.iter().enumerate() {
            // Credentials go to the image's own registry, never to a mirror.
            let creds = creds.filter(|_| i + 1 == hosts.len());
            match self
                .get_from(host, &reference.repository, path, extra, creds)
                .await
            {
                Ok(ok) => return Ok(ok),
                Err(e) => {
                    if i + 1 < hosts.len() {
                        log::warn!("mirror {host} failed for {reference}: {e}; trying the next");
                    }
                    last_err = Some(e);
                }
            }
        }
        Err(last_err.unwrap_or_else(|| RegistryError::Status {
            url: path.to_owned(),
            status: StatusCode::NOT_FOUND,
            detail: String::new(),
        }))
    }

    async fn get_from(
        &self,
        host: &str,
        repository: &str,
        path: &str,
        extra: &HeaderMap,
        creds: Option<&Credentials>,
    ) -> Result<(Uri, hyper::Response<Incoming>), RegistryError> {
        let url = self.url(host, path)?;
        let token_key = (
            host.to_owned(),
            repository.to_owned(),
            credentials_key(creds),
        );
        let mut fetched_token = false;
        let mut basic = false;
        loop {
            let mut headers = extra.clone();
            let authorization = match (basic, creds) {
                (true, Some(c)) => Some(c.basic()),
                _ => self
                    .tokens
                    .borrow()
                    .get(&token_key)
                    .map(|t| format!("Bearer {t}")),
            };
            if let Some(mut value) = authorization.and_then(|a| HeaderValue::from_str(&a).ok()) {
                value.set_sensitive(true);
                headers.insert(AUTHORIZATION, value);
            }
            let (final_url, response) = self.http.get(Method::GET, &url, &headers, false).await?;
            let status = response.status();
            if status.is_success() {
                return Ok((final_url, response));
            }
            if status == StatusCode::UNAUTHORIZED && !fetched_token && !basic {
                let challenge = response
                    .headers()
                    .get(WWW_AUTHENTICATE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                if challenge
                    .trim_start()
                    .to_ascii_lowercase()
                    .starts_with("basic")
                    && creds.is_some()
                {
                    basic = true;
                    continue;
                }
                let token = self
                    .fetch_token(&url, &challenge, repository, creds)
                    .await?;
                self.tokens.borrow_mut().insert(token_key.clone(), token);
                fetched_token = true;
                continue;
            }
            let detail = read_body(&final_url, response.into_body(), 4096)
                .await
                .ok()
                .and_then(|b| error_detail(&b))
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            return Err(RegistryError::Status {
                url: final_url.to_string(),
                status,
                detail,
            });
        }
    }

    /// The Bearer-token flow: ask the challenge's realm for a pull token for
    /// this repository, anonymously or with the credentials (HTTP Basic).
    async fn fetch_token(
        &self,
        url: &Uri,
        challenge: &str,
        repository: &str,
        creds: Option<&Credentials>,
    ) -> Result<String, RegistryError> {
        let unauthorized = || RegistryError::Unauthorized {
            url: url.to_string(),
            challenge: challenge.to_owned(),
        };
        // A registry reached over plain HTTP (allowed by configuration) may
        // name a plain-HTTP token realm; one reached over HTTPS may not.
        let plain_registry = url.scheme_str() == Some("http");
        let params = parse_challenge(challenge).ok_or_else(unauthorized)?;
        let realm = params.get("realm").ok_or_else(unauthorized)?;
        let mut query = Vec::new();
        if let Some(service) = params.get("service") {
            query.push(format!("service={}", crate::http::percent_encode(service)));
        }
        let scope = params
            .get("scope")
            .cloned()
            .unwrap_or_else(|| format!("repository:{repository}:pull"));
        query.push(format!("scope={}", crate::http::percent_encode(&scope)));
        let sep = if realm.contains('?') { '&' } else { '?' };
        let token_url_text = format!("{realm}{sep}{}", query.join("&"));
        let token_url: Uri = token_url_text.parse().map_err(|_| RegistryError::Token {
            url: token_url_text.clone(),
            message: "invalid realm".into(),
        })?;
        let mut headers = HeaderMap::new();
        if let Some(mut value) = creds.and_then(|c| HeaderValue::from_str(&c.basic()).ok()) {
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let (final_url, response) = self
            .http
            .get(Method::GET, &token_url, &headers, plain_registry)
            .await?;
        if !response.status().is_success() {
            return Err(RegistryError::Status {
                url: final_url.to_string(),
                status: response.status(),
                detail: String::new(),
            });
        }
        let body = read_body(&final_url, response.into_body(), MAX_TOKEN).await?;
        #[derive(serde::Deserialize)]
        struct TokenResponse {
            token: Option<String>,
            access_token: Option<String>,
        }
        let parsed: TokenResponse =
            serde_json::from_slice(&body).map_err(|e| RegistryError::Token {
                url: final_url.to_string(),
                message: e.to_string(),
            })?;
        parsed
            .token
            .or(parsed.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| RegistryError::Token {
                url: final_url.to_string(),
                message: "no token in response".into(),
            })
    }
}

/// `Bearer realm="https://auth",service="registry",scope="..."` → its
/// parameters; `None` for other schemes (Basic needs credentials).
pub(super) fn parse_challenge(challenge: &str) -> Option<HashMap<String, String>> {
    let rest = challenge.trim();
    let (scheme, params) = rest.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut out = HashMap::new();
    let mut chars = params.trim().chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        let value = if chars.peek() == Some(&'"') {
            chars.next();
            let mut v = String::new();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => v.extend(chars.next()),
                    '"' => break,
                    c => v.push(c),
                }
            }
            v
        } else {
            chars.by_ref().take_while(|c| *c != ',').collect()
        };
        out.insert(key.trim().to_ascii_lowercase(), value);
    }
    Some(out)
}

/// The first message of a Distribution error body.
pub(super) fn error_detail(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = v.get("errors")?.get(0)?;
    let code = e.get("code").and_then(|c| c.as_str()).unwrap_or("");
    let message = e.get("message").and_then(|c| c.as_str()).unwrap_or("");
    Some(format!("{code} {message}").trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges() {
        let p = parse_challenge(r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull""#).unwrap();
        assert_eq!(p["realm"], "https://auth.docker.io/token");
        assert_eq!(p["service"], "registry.docker.io");
        assert_eq!(p["scope"], "repository:library/busybox:pull");
        assert!(parse_challenge(r#"Basic realm="x""#).is_none());
        assert_eq!(
            crate::http::percent_encode("repository:a/b:pull"),
            "repository%3Aa%2Fb%3Apull"
        );
    }

    #[test]
    fn error_bodies() {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown"}]}"#;
        assert_eq!(
            error_detail(body).as_deref(),
            Some("MANIFEST_UNKNOWN manifest unknown")
        );
        assert_eq!(error_detail(b"nope"), None);
    }
}
