//! What kube-controller-manager does with kubelets' certificate signing
//! requests. Its csrapproving controller approves a node client
//! certificate when RBAC lets the requester ask for one
//! (`certificatesigningrequests/selfnodeclient` for a node renewing its
//! own, `certificatesigningrequests/nodeclient` for anyone else, such as a
//! bootstrapper); serving certificates (`kubernetes.io/kubelet-serving`)
//! it never approves: an administrator does. Its signers then refuse what
//! their signer name does not allow (a `Failed` condition, as upstream).

use serde_json::{Value, json};
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

use crate::store::Store;

pub const KUBELET_CLIENT: &str = "kubernetes.io/kube-apiserver-client-kubelet";
pub const KUBELET_SERVING: &str = "kubernetes.io/kubelet-serving";

/// The parts of a PKCS#10 request the signers' rules read.
struct Request {
    common_name: String,
    organizations: Vec<String>,
    /// DNS names and IP addresses asked for.
    names: usize,
    /// Email addresses, URIs and other names asked for.
    other_names: usize,
}

fn parse(csr: &Value) -> Result<Request, String> {
    use base64::Engine;
    let encoded = csr
        .pointer("/spec/request")
        .and_then(Value::as_str)
        .unwrap_or("");
    let pem_bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| "spec.request is not base64".to_owned())?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem_bytes)
        .map_err(|_| "spec.request is not a PEM block".to_owned())?;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
            .map_err(|_| "spec.request is not a certificate request".to_owned())?;
    let subject = &request.certification_request_info.subject;
    let strings = |values: Vec<Option<&str>>| -> Vec<String> {
        values.into_iter().flatten().map(str::to_owned).collect()
    };
    let common_names = strings(
        subject
            .iter_common_name()
            .map(|a| a.as_str().ok())
            .collect(),
    );
    let mut parsed = Request {
        common_name: common_names.first().cloned().unwrap_or_default(),
        organizations: strings(
            subject
                .iter_organization()
                .map(|a| a.as_str().ok())
                .collect(),
        ),
        names: 0,
        other_names: 0,
    };
    for extension in request.requested_extensions().into_iter().flatten() {
        if let ParsedExtension::SubjectAlternativeName(san) = extension {
            for name in &san.general_names {
                match name {
                    GeneralName::DNSName(_) | GeneralName::IPAddress(_) => parsed.names += 1,
                    _ => parsed.other_names += 1,
                }
            }
        }
    }
    Ok(parsed)
}

fn usages(csr: &Value) -> Vec<&str> {
    let mut usages: Vec<&str> = csr
        .pointer("/spec/usages")
        .and_then(Value::as_array)
        .map(|u| u.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    usages.sort_unstable();
    usages.dedup();
    usages
}

fn signer(csr: &Value) -> &str {
    csr.pointer("/spec/signerName")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// A node's certificate as upstream's signer validates it: the node's
/// name and group, and exactly these usages (key encipherment optional).
fn node_certificate(request: &Request, usages: &[&str], purpose: &str) -> Result<(), String> {
    if request.organizations != ["system:nodes"] {
        return Err("organization must be exactly [system:nodes]".into());
    }
    if request
        .common_name
        .strip_prefix("system:node:")
        .is_none_or(str::is_empty)
    {
        return Err("common name must begin with \"system:node:\"".into());
    }
    let mut required = vec!["digital signature", purpose];
    required.sort_unstable();
    let mut with_key = vec!["digital signature", "key encipherment", purpose];
    with_key.sort_unstable();
    if usages != required && usages != with_key {
        return Err(format!(
            "usages did not match [digital signature key encipherment {purpose}]"
        ));
    }
    Ok(())
}

/// What the signer named by the request refuses in it (None: it may sign).
/// Signers other than the kubelets' sign what was approved.
pub fn signer_refusal(csr: &Value) -> Option<String> {
    let check = |purpose: &str, names_needed: bool| -> Result<(), String> {
        let request = parse(csr)?;
        node_certificate(&request, &usages(csr), purpose)?;
        if request.other_names > 0 {
            return Err("email and URI subject alternative names are not allowed".into());
        }
        match (names_needed, request.names) {
            (true, 0) => Err("at least one DNS or IP subjectAltName is required".into()),
            (false, n) if n > 0 => {
                Err("DNS or IP subjectAltNames are not allowed for client certificates".into())
            }
            _ => Ok(()),
        }
    };
    let checked = match signer(csr) {
        KUBELET_CLIENT => check("client auth", false),
        KUBELET_SERVING => check("server auth", true),
        _ => Ok(()),
    };
    checked.err()
}

/// The csrapproving controller's verdict: the approval's message, when it
/// approves.
pub fn auto_approval(store: &Store, csr: &Value) -> Option<&'static str> {
    if signer(csr) != KUBELET_CLIENT || signer_refusal(csr).is_some() {
        return None;
    }
    let request = parse(csr).ok()?;
    let spec = csr.get("spec")?;
    let username = spec.get("username").and_then(Value::as_str).unwrap_or("");
    let mut recognizers = Vec::new();
    if username == request.common_name {
        recognizers.push((
            "selfnodeclient",
            "Auto approving self kubelet client certificate after SubjectAccessReview.",
        ));
    }
    recognizers.push((
        "nodeclient",
        "Auto approving kubelet client certificate after SubjectAccessReview.",
    ));
    recognizers.into_iter().find_map(|(subresource, message)| {
        let review = json!({
            "user": username,
            "groups": spec.get("groups").cloned().unwrap_or(json!([])),
            "resourceAttributes": {"group": "certificates.k8s.io", "resource": "certificatesigningrequests",
                                   "verb": "create", "subresource": subresource},
        });
        crate::reviews::allows(store, &review).then_some(message)
    })
}
