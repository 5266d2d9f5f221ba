//! What the API server answers in protobuf (a Lease renewal's answer, a
//! Status), read as the agent reads it: a resourceVersion, a reason and a
//! message. It may fail on any input, never panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::kube::protobuf::fuzzing::answer(data);
});
