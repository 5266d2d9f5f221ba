mod config;
mod http;
mod image;
mod mount;
mod pod;
mod quantity;
mod rt;
mod state;

fn main() {}
