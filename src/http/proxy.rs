//! Outbound proxies as Go programs (and so kubelets) read them from the
//! environment: `HTTPS_PROXY` for https URLs, `HTTP_PROXY` for http ones
//! (either case), `NO_PROXY` with hosts, domains (`.example.com` or
//! `example.com`, subdomains included), IPs, CIDRs, optional ports, or `*`.
//! Loopback and `localhost` are never proxied. Connections go through the
//! proxy with CONNECT, so TLS stays end to end.

use std::net::IpAddr;

use base64::Engine;
use futures_lite::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyServer {
    pub host: String,
    pub port: u16,
    /// `user:password` from the proxy URL, for Proxy-Authorization.
    pub credentials: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxyConfig {
    https: Option<ProxyServer>,
    http: Option<ProxyServer>,
    no_proxy: Vec<String>,
}

fn env(names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| std::env::var(n).ok())
        .filter(|v| !v.trim().is_empty())
}

/// `http://user:pw@proxy:3128` (the scheme may be left out) → the server.
fn parse_proxy(text: &str) -> Option<ProxyServer> {
    let rest = text.trim();
    let rest = match rest.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => {
            log::warn!("proxy {rest:?}: only http:// proxies are supported; not using it");
            return None;
        }
        None => rest,
    };
    let authority = rest.split('/').next()?;
    let (credentials, hostport) = match authority.rsplit_once('@') {
        Some((creds, hp)) => (Some(creds.to_owned()), hp),
        None => (None, authority),
    };
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
            (h.to_owned(), p.parse().ok()?)
        }
        _ => (hostport.to_owned(), 80),
    };
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    (!host.is_empty()).then_some(ProxyServer {
        host,
        port,
        credentials,
    })
}

impl ProxyConfig {
    pub fn from_env() -> ProxyConfig {
        ProxyConfig::parse(
            env(&["HTTPS_PROXY", "https_proxy"]).as_deref(),
            env(&["HTTP_PROXY", "http_proxy"]).as_deref(),
            env(&["NO_PROXY", "no_proxy"]).as_deref(),
        )
    }

    pub fn parse(https: Option<&str>, http: Option<&str>, no_proxy: Option<&str>) -> ProxyConfig {
        ProxyConfig {
            https: https.and_then(parse_proxy),
            http: http.and_then(parse_proxy),
            no_proxy: no_proxy
                .unwrap_or("")
                .split(',')
                .map(|e| e.trim().to_ascii_lowercase())
                .filter(|e| !e.is_empty())
                .collect(),
        }
    }

    /// The proxy for a connection to `host:port` over TLS or not, if any.
    pub fn for_target(&self, tls: bool, host: &str, port: u16) -> Option<&ProxyServer> {
        let proxy = if tls { &self.https } else { &self.http }.as_ref()?;
        let host = host.to_ascii_lowercase();
        if host == "localhost" {
            return None;
        }
        let ip: Option<IpAddr> = host.parse().ok();
        if ip.is_some_and(|ip| ip.is_loopback()) {
            return None;
        }
        for entry in &self.no_proxy {
            if entry == "*" {
                return None;
            }
            // host:port entries match that port only.
            let (name, entry_port) = match entry.rsplit_once(':') {
                Some((n, p)) if !n.contains(':') && p.parse::<u16>().is_ok() => {
                    (n, p.parse::<u16>().ok())
                }
                _ => (entry.as_str(), None),
            };
            if entry_port.is_some_and(|p| p != port) {
                continue;
            }
            if let (Some(ip), Some((net, bits))) = (ip, name.split_once('/'))
                && let (Ok(net), Ok(bits)) = (net.parse::<IpAddr>(), bits.parse::<u32>())
                && in_cidr(ip, net, bits)
            {
                return None;
            }
            let domain = name.trim_start_matches('.');
            if host == domain || host.ends_with(&format!(".{domain}")) {
                return None;
            }
        }
        Some(proxy)
    }
}

fn in_cidr(ip: IpAddr, net: IpAddr, bits: u32) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(b)) if bits <= 32 => {
            let mask = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & mask == u32::from(b) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(b)) if bits <= 128 => {
            let mask = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & mask == u128::from(b) & mask
        }
        _ => false,
    }
}

/// Asks the proxy on `stream` for a tunnel to `host:port`; on success the
/// stream then carries the connection to the target.
pub async fn connect_tunnel<S>(
    stream: &mut S,
    proxy: &ProxyServer,
    host: &str,
    port: u16,
) -> std::io::Result<()>
where
    S: futures_lite::AsyncRead + futures_lite::AsyncWrite + Unpin,
{
    let target = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(creds) = &proxy.credentials {
        let encoded = base64::engine::general_purpose::STANDARD.encode(creds);
        request.push_str(&format!("Proxy-Authorization: Basic {encoded}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await?;
    stream.flush().await?;
    // Read the response head byte by byte: nothing of the tunnel's own
    // traffic may be consumed here.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 || stream.read(&mut byte).await? == 0 {
            return Err(std::io::Error::other("proxy closed or sent a bad response"));
        }
        head.push(byte[0]);
    }
    let status_line = String::from_utf8_lossy(&head);
    let status_line = status_line.lines().next().unwrap_or("");
    let code = status_line.split_whitespace().nth(1).unwrap_or("");
    if code != "200" {
        return Err(std::io::Error::other(format!(
            "proxy {}:{} refused the tunnel: {status_line}",
            proxy.host, proxy.port
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_proxy_as_go_reads_it() {
        let c = ProxyConfig::parse(
            Some("http://u:p@proxy.example:3128"),
            Some("proxy2:8080"),
            Some("example.org, .corp.test,10.0.0.0/8, registry:5000"),
        );
        let https = c.for_target(true, "api.cluster.test", 443).unwrap();
        assert_eq!(
            (
                https.host.as_str(),
                https.port,
                https.credentials.as_deref()
            ),
            ("proxy.example", 3128, Some("u:p"))
        );
        assert_eq!(c.for_target(false, "x.test", 80).unwrap().port, 8080);
        assert!(c.for_target(true, "example.org", 443).is_none());
        assert!(c.for_target(true, "a.example.org", 443).is_none());
        assert!(c.for_target(true, "a.corp.test", 443).is_none());
        assert!(c.for_target(true, "10.1.2.3", 6443).is_none());
        assert!(c.for_target(true, "11.1.2.3", 6443).is_some());
        assert!(c.for_target(true, "registry", 5000).is_none());
        assert!(c.for_target(true, "registry", 443).is_some());
        assert!(c.for_target(true, "127.0.0.1", 6443).is_none());
        assert!(c.for_target(true, "localhost", 6443).is_none());
        let all = ProxyConfig::parse(Some("p:1"), None, Some("*"));
        assert!(all.for_target(true, "x", 1).is_none());
        assert!(
            ProxyConfig::parse(Some("socks5://p:1"), None, None)
                .for_target(true, "x", 1)
                .is_none()
        );
    }

    #[test]
    fn tunnels_through_a_connect_proxy() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let proxy = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                conn.read_exact(&mut byte).unwrap();
                head.push(byte[0]);
            }
            conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\ntunnelled")
                .unwrap();
            String::from_utf8(head).unwrap()
        });
        let server = ProxyServer {
            host: "127.0.0.1".into(),
            port: addr.port(),
            credentials: Some("u:p".into()),
        };
        let rest = smol::block_on(async {
            let mut stream = smol::net::TcpStream::connect(addr).await.unwrap();
            connect_tunnel(&mut stream, &server, "registry.example", 443)
                .await
                .unwrap();
            let mut rest = String::new();
            stream.read_to_string(&mut rest).await.unwrap();
            rest
        });
        assert_eq!(rest, "tunnelled");
        let head = proxy.join().unwrap();
        assert!(
            head.starts_with("CONNECT registry.example:443 HTTP/1.1\r\n"),
            "{head}"
        );
        assert!(
            head.contains("Proxy-Authorization: Basic dTpw\r\n"),
            "{head}"
        );
    }
}
