//! `Status` responses: the error shapes clients parse (kubectl prints their
//! `message`; client libraries branch on `reason` and `code`).

use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

pub type ApiResult<T> = Result<T, ApiError>;

/// `pods`, or `leases.coordination.k8s.io`, as messages name resources.
fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_owned()
    } else {
        format!("{plural}.{group}")
    }
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: Value::Null,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> ApiError {
        let mut details = json!({"name": name, "kind": kind});
        if !group.is_empty() {
            details["group"] = group.into();
        }
        self.details = details;
        self
    }

    /// `pods "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> ApiError {
        let what = qualified(group, plural);
        ApiError::new(404, "NotFound", format!("{what} \"{name}\" not found"))
            .with_details(group, plural, name)
    }

    pub fn already_exists(group: &str, plural: &str, name: &str) -> ApiError {
        let what = qualified(group, plural);
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{what} \"{name}\" already exists"),
        )
        .with_details(group, plural, name)
    }

    /// The optimistic-concurrency failure of an update with a stale
    /// resourceVersion.
    pub fn conflict(group: &str, plural: &str, name: &str) -> ApiError {
        let what = qualified(group, plural);
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {what} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(group, plural, name)
    }

    pub fn precondition(group: &str, plural: &str, name: &str, message: String) -> ApiError {
        let what = qualified(group, plural);
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {what} \"{name}\": {message}"),
        )
        .with_details(group, plural, name)
    }

    /// 422 with the field causes, as validation failures.
    pub fn invalid(kind: &str, name: &str, field: &str, message: &str) -> ApiError {
        let mut e = ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {field}: {message}"),
        );
        e.details = json!({"name": name, "kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": message, "field": field}]});
        e
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> ApiError {
        ApiError::new(410, "Expired", message)
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if !self.details.is_null() {
            status["details"] = self.details.clone();
        }
        status
    }
}

/// The Status the real server returns for a successful delete of some
/// objects (and of collections).
pub fn success(details: Value) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}
