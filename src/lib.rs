//! nanolet as a library: the binary (`src/main.rs`) is its command line,
//! and the test API server reuses its pod model and HTTP plumbing.

pub mod agent;
pub(crate) mod certificates;
pub mod cgroup;
pub mod cli;
pub mod config;
pub mod device;
pub(crate) mod helpers;
pub mod http;
pub mod image;
pub mod kube;
pub mod monitor;
pub(crate) mod mount;
pub mod pod;
pub(crate) mod protobuf_wire;
pub mod quantity;
pub(crate) mod rooted;
pub mod rt;
pub mod runtime;
pub mod server;
pub mod state;
pub(crate) mod stats;
