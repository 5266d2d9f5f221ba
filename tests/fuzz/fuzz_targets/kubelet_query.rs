//! A kubelet API query string, parsed as every handler parses it (pairs,
//! containerLogs options, port-forward ports).
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::server::fuzzing::kubelet_query(data);
});
