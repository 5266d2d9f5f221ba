//! A SPDY session fed arbitrary client frames; its streams are read to their end.
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::server::fuzzing::spdy_session(data);
});
