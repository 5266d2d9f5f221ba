//! A certificate's DER, as a kubelet API client shows it or the API
//! server issues it: subject, validity and public key read out.
//! It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::server::fuzzing::x509(data);
});
