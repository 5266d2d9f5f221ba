//! The messages of the device plugin API `v1beta1` (upstream's
//! `k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1/api.proto`), written and
//! read by hand: a dozen small messages do not pay for a protobuf code
//! generator in the build. Field numbers are upstream's; unknown fields are
//! skipped, as protobuf readers do, so newer plugins still talk to us.
//!
//! Everything read comes from a plugin's socket: every length is checked
//! against the bytes there are, nothing recurses, and what a message may
//! hold is capped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::protobuf_wire::{self, Value, put_bytes, put_uint};

/// The only version there is, in `RegisterRequest.version`.
pub const VERSION: &str = "v1beta1";

/// Upstream's device health values; any other counts as unhealthy.
pub const HEALTHY: &str = "Healthy";

/// Devices one resource may list. Upstream has no cap but gRPC's 4 MiB a
/// message; a board's agent is not where a million device IDs should live.
pub const MAX_DEVICES: usize = 4096;

/// Entries (envs, mounts, device nodes, annotations, CDI names) one
/// allocation may carry.
pub const MAX_EDITS: usize = 1024;

/// A device ID's length. Plugins name devices by a path, a serial or a
/// UUID; each ID is kept in memory and in the checkpoint.
pub const MAX_DEVICE_ID: usize = 256;

/// One container's Allocate answer, which the checkpoint keeps for as long
/// as the container lives.
pub const MAX_ALLOCATE_ANSWER: usize = 256 * 1024;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ApiError {
    #[error("malformed protobuf at byte {0}")]
    Malformed(usize),
    #[error("field {0} is not UTF-8")]
    NotText(u32),
    #[error("field {0} has the wrong wire type")]
    WireType(u32),
    #[error("more than {limit} {what} in one message")]
    TooMany { what: &'static str, limit: usize },
    #[error("the answer has no container response")]
    NoContainer,
    #[error("{what} longer than {limit} bytes")]
    TooLong { what: &'static str, limit: usize },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DevicePluginOptions {
    pub pre_start_required: bool,
    pub get_preferred_allocation_available: bool,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegisterRequest {
    pub version: String,
    /// The plugin's socket, relative to the device plugins' directory.
    pub endpoint: String,
    pub resource_name: String,
    pub options: DevicePluginOptions,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Device {
    pub id: String,
    pub health: String,
}

impl Device {
    pub fn healthy(&self) -> bool {
        self.health == HEALTHY
    }
}

/// What `Allocate` answers for one container: what the runtime must give
/// it for its devices to work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerAllocateResponse {
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub mounts: Vec<Mount>,
    #[serde(default)]
    pub devices: Vec<DeviceSpec>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names (`vendor.com/class=name`).
    #[serde(default)]
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Mount {
    pub container_path: String,
    pub host_path: String,
    #[serde(default)]
    pub read_only: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSpec {
    pub container_path: String,
    pub host_path: String,
    /// cgroup permissions: any of r, w and m.
    #[serde(default)]
    pub permissions: String,
}

// ---- reading ----

/// Calls `each` with every field of `message`.
fn walk<'a>(
    message: &'a [u8],
    mut each: impl FnMut(u32, Value<'a>) -> Result<(), ApiError>,
) -> Result<(), ApiError> {
    let mut fields = protobuf_wire::fields(message);
    while let Some((number, value)) = fields
        .next_field()
        .map_err(|protobuf_wire::Malformed(at)| ApiError::Malformed(at))?
    {
        each(number, value)?;
    }
    Ok(())
}

fn text(number: u32, bytes: &[u8]) -> Result<String, ApiError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
        .map_err(|_| ApiError::NotText(number))
}

/// A string field: a value of another wire type is a malformed message.
fn string_of(number: u32, value: Value) -> Result<String, ApiError> {
    match value {
        Value::Bytes(bytes) => text(number, bytes),
        _ => Err(ApiError::WireType(number)),
    }
}

fn bool_of(number: u32, value: Value) -> Result<bool, ApiError> {
    match value {
        Value::Varint(v) => Ok(v != 0),
        _ => Err(ApiError::WireType(number)),
    }
}

fn message_of<'a>(number: u32, value: Value<'a>) -> Result<&'a [u8], ApiError> {
    match value {
        Value::Bytes(bytes) => Ok(bytes),
        _ => Err(ApiError::WireType(number)),
    }
}

fn push_capped<T>(
    list: &mut Vec<T>,
    item: T,
    what: &'static str,
    limit: usize,
) -> Result<(), ApiError> {
    if list.len() >= limit {
        return Err(ApiError::TooMany { what, limit });
    }
    list.push(item);
    Ok(())
}

pub fn decode_options(message: &[u8]) -> Result<DevicePluginOptions, ApiError> {
    let mut options = DevicePluginOptions::default();
    walk(message, |number, value| {
        match number {
            1 => options.pre_start_required = bool_of(number, value)?,
            2 => options.get_preferred_allocation_available = bool_of(number, value)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(options)
}

pub fn decode_register_request(message: &[u8]) -> Result<RegisterRequest, ApiError> {
    let mut request = RegisterRequest::default();
    walk(message, |number, value| {
        match number {
            1 => request.version = string_of(number, value)?,
            2 => request.endpoint = string_of(number, value)?,
            3 => request.resource_name = string_of(number, value)?,
            4 => request.options = decode_options(message_of(number, value)?)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok(request)
}

/// A `ListAndWatchResponse`: the resource's whole device list.
pub fn decode_list_and_watch(message: &[u8]) -> Result<Vec<Device>, ApiError> {
    let mut devices = Vec::new();
    walk(message, |number, value| {
        if number == 1 {
            let mut device = Device::default();
            walk(message_of(number, value)?, |number, value| {
                match number {
                    1 => device.id = string_of(number, value)?,
                    2 => device.health = string_of(number, value)?,
                    // 3: topology, which nanolet does not align to.
                    _ => {}
                }
                Ok(())
            })?;
            if device.id.len() > MAX_DEVICE_ID {
                return Err(ApiError::TooLong {
                    what: "a device ID",
                    limit: MAX_DEVICE_ID,
                });
            }
            push_capped(&mut devices, device, "devices", MAX_DEVICES)?;
        }
        Ok(())
    })?;
    Ok(devices)
}

/// A map entry: key 1, value 2.
fn entry(message: &[u8]) -> Result<(String, String), ApiError> {
    let (mut key, mut value) = (String::new(), String::new());
    walk(message, |number, v| {
        match number {
            1 => key = string_of(number, v)?,
            2 => value = string_of(number, v)?,
            _ => {}
        }
        Ok(())
    })?;
    Ok((key, value))
}

fn decode_container_response(message: &[u8]) -> Result<ContainerAllocateResponse, ApiError> {
    let mut response = ContainerAllocateResponse::default();
    let mut entries = 0usize;
    walk(message, |number, value| {
        entries += 1;
        if entries > 5 * MAX_EDITS {
            return Err(ApiError::TooMany {
                what: "entries",
                limit: 5 * MAX_EDITS,
            });
        }
        match number {
            1 | 4 => {
                let (key, v) = entry(message_of(number, value)?)?;
                let map = if number == 1 {
                    &mut response.envs
                } else {
                    &mut response.annotations
                };
                if map.len() >= MAX_EDITS {
                    return Err(ApiError::TooMany {
                        what: "map entries",
                        limit: MAX_EDITS,
                    });
                }
                map.insert(key, v);
            }
            2 => {
                let mut mount = Mount::default();
                walk(message_of(number, value)?, |number, value| {
                    match number {
                        1 => mount.container_path = string_of(number, value)?,
                        2 => mount.host_path = string_of(number, value)?,
                        3 => mount.read_only = bool_of(number, value)?,
                        _ => {}
                    }
                    Ok(())
                })?;
                push_capped(&mut response.mounts, mount, "mounts", MAX_EDITS)?;
            }
            3 => {
                let mut device = DeviceSpec::default();
                walk(message_of(number, value)?, |number, value| {
                    match number {
                        1 => device.container_path = string_of(number, value)?,
                        2 => device.host_path = string_of(number, value)?,
                        3 => device.permissions = string_of(number, value)?,
                        _ => {}
                    }
                    Ok(())
                })?;
                push_capped(&mut response.devices, device, "device nodes", MAX_EDITS)?;
            }
            5 => {
                let mut name = String::new();
                walk(message_of(number, value)?, |number, value| {
                    if number == 1 {
                        name = string_of(number, value)?;
                    }
                    Ok(())
                })?;
                push_capped(&mut response.cdi_devices, name, "CDI devices", MAX_EDITS)?;
            }
            _ => {}
        }
        Ok(())
    })?;
    Ok(response)
}

/// The first container's response of an `AllocateResponse`: nanolet asks
/// for one container at a time, as upstream.
pub fn decode_allocate_response(message: &[u8]) -> Result<ContainerAllocateResponse, ApiError> {
    if message.len() > MAX_ALLOCATE_ANSWER {
        return Err(ApiError::TooLong {
            what: "the answer",
            limit: MAX_ALLOCATE_ANSWER,
        });
    }
    let mut first = None;
    walk(message, |number, value| {
        if number == 1 && first.is_none() {
            first = Some(decode_container_response(message_of(number, value)?)?);
        }
        Ok(())
    })?;
    first.ok_or(ApiError::NoContainer)
}

/// The device IDs the plugin prefers for the one container asked about.
pub fn decode_preferred_allocation(message: &[u8]) -> Result<Vec<String>, ApiError> {
    let mut ids = Vec::new();
    let mut seen_container = false;
    walk(message, |number, value| {
        if number == 1 && !seen_container {
            seen_container = true;
            walk(message_of(number, value)?, |number, value| {
                if number == 1 {
                    push_capped(&mut ids, string_of(number, value)?, "devices", MAX_DEVICES)?;
                }
                Ok(())
            })?;
        }
        Ok(())
    })?;
    Ok(ids)
}

// ---- writing ----

fn put_strings(out: &mut Vec<u8>, number: u32, strings: &[String]) {
    for s in strings {
        put_bytes(out, number, s.as_bytes());
    }
}

/// An `AllocateRequest` for one container.
pub fn allocate_request(device_ids: &[String]) -> Vec<u8> {
    let mut container = Vec::new();
    put_strings(&mut container, 1, device_ids);
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &container);
    out
}

/// A `PreferredAllocationRequest` for one container.
pub fn preferred_allocation_request(
    available: &[String],
    must_include: &[String],
    size: usize,
) -> Vec<u8> {
    let mut container = Vec::new();
    put_strings(&mut container, 1, available);
    put_strings(&mut container, 2, must_include);
    if size > 0 {
        put_uint(&mut container, 3, size as u64);
    }
    let mut out = Vec::new();
    put_bytes(&mut out, 1, &container);
    out
}

/// A `PreStartContainerRequest`.
pub fn pre_start_request(device_ids: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    put_strings(&mut out, 1, device_ids);
    out
}

/// For the fuzz target: every decoder on the same bytes; any may fail,
/// none may panic.
pub mod fuzzing {
    pub fn message(data: &[u8]) {
        let _ = super::decode_options(data);
        let _ = super::decode_register_request(data);
        let _ = super::decode_list_and_watch(data);
        let _ = super::decode_allocate_response(data);
        let _ = super::decode_preferred_allocation(data);
    }
}

#[cfg(test)]
mod tests;
