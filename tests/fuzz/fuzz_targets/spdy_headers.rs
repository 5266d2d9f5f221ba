//! SPDY header blocks, inflated as a connection's zlib stream and decoded.
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::server::fuzzing::spdy_headers(data);
});
