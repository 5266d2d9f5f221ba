//! What a device plugin (or a client of kubelet.sock) sends: every device
//! plugin API message read from the bytes, the bytes as a gRPC body cut
//! into frames, and the bytes as a CDI spec. Any may fail, none may panic.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    nanolet::device::api::fuzzing::message(data);
    nanolet::device::grpc::fuzzing::body(data);
    nanolet::device::cdi::fuzzing::spec(data);
});
