mod cgroup;
mod config;
mod http;
mod image;
mod monitor;
mod mount;
mod pod;
mod quantity;
mod rt;
mod runtime;
mod state;

fn main() {}
